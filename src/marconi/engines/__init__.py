"""The engines, in one place: marconi's own engine over Hugging Face hybrid models
(`hf/`), SGLang's and vLLM's real cache code driven in their own environments (`real/`),
and marconi's policies installed inside those engines' own caches (`integrations/`).
Importing this package loads nothing; each part is imported as its own module
(docs/architecture.md, "Layers")."""
