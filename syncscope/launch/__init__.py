"""Launch: ``syncscope profile`` from the command line to the report.

``job.py`` (``profile()``) checks the request, prepares the run directory, runs the job and reports it;
``torchrun.py`` starts the ranks through torch's own launcher and watches them
(``rendezvous.py`` says what a multi-node rendezvous waits for). Each rank then runs
``python -m syncscope.launch.attach`` (``attach.py``), which starts capture.
"""
