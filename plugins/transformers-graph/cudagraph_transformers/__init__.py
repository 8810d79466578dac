"""transformers LlamaForCausalLM with its StaticCache, as runtimes for the conformance suites."""
