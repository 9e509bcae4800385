"""The per-rank recorder: one class (``core.Recorder``) in parts, each a mixin of its own
state: ``registry`` (the wrapped models and their sync state), ``steps`` (optimizer steps:
where windows end), ``gradients`` (the gradient index and content probes), ``pending``
(asynchronous work); ``records`` are the compact records its hot hooks keep."""
