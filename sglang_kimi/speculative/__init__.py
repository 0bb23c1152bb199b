"""The product on SGLang's side: speculative workers, adaptive runtime, start-up checks, metrics."""
