"""The model math in pure JAX: an Architecture, its weights, the operations of one block, the forward
pass (`transformer`) and the KVState it reads and writes. Nothing here imports a kernel: a kernel plan
(jgpt.kernels) plugs compiled kernels in through the callables the forward pass receives."""
