"""What capture installs in the user's process to feed the recorder: ``install`` (the
patches of wrappers, optimizers and autograd), ``collectives`` (every c10d collective,
through a Python kernel), ``deepspeed_engine`` (DeepSpeed's engine as a wrapper), ``imports``
(a callback when a module is imported) and ``opaque`` (hook bodies out of Dynamo's reach)."""
