"""torch.compile(mode="reduce-overhead") over the reference model, as a third-party runtime."""
