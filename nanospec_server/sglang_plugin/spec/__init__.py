"""The speculative core: draft workers, NanoSpec's runtime and packed head, verify capture, draft kinds, adaptive depth."""
