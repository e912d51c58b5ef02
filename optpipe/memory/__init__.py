"""The memory core: one accounting of bytes per action, shared by the simulator, the
optimizers and the runtime; a model of PyTorch's caching allocator; a spatio-temporal
buffer planner."""
