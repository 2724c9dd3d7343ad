"""Hooks that let SGLang's CPU path serve speculation: packed linear layers, gloo tensor parallelism, sampling verify."""
