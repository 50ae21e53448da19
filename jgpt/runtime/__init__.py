"""The process and its devices: JAX backends and meshes, the persistent compilation cache and the
trusted cache directories it and the kernels use, and the malloc settings a process starts with."""
