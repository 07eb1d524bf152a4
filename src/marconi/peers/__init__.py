"""Today's engines' policies as peers: SGLang's MambaRadixCache, vLLM v1's align mode
(what each models: docs/peers.md)."""
