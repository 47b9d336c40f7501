"""The Megatron training backend: megatron-core behind the `TrainBackend` seam (docs/adr/0006).

Modules: `cpu` (the only place that patches torch for the run), `parallel` (layout, process groups),
`attention` (SDPA core attention), `model` (architecture, config, layer spec, build), `convert`
(Hugging Face <-> Megatron weights), `kernels` (loss head), `backend`/`checkpoint` (the backend), `startup`
(how a rank's process imports megatron-core: without its W&B/TensorBoard loggers, on CPU without compiling).
Nothing is imported here: megatron-core stays out of processes that do not train with it.
"""
