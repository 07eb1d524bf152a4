"""Today's engines as their own code: replay a trace through SGLang's and vLLM's real cache
classes, each in its own environment (scripts/setup-peers.sh), and read back per request
what the engine served (docs/peers.md). The simulator's side of it, `replay` below, is
`marconi.sim.real_engine`; this package holds the environments, the workers and the engine
flags both sides read.

```
marconi (this process)                 engine environment (.venv-peers/ENGINE)
replay(trace, config, system)  ---->   ENGINE_worker.py --trace T.npz --options O.json
  options from the capacity            drives the engine's cache as its scheduler does
  records, stats  <--------------      result.npz (per request), meta.json; progress lines
```
The workers import only the standard library, numpy, torch and their engine; nothing here
imports an engine, so neither the core nor the main environment depends on one.
"""
