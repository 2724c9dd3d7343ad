"""Adaptive speculation: the draft depth each step, from batch size, acceptance and cost."""
