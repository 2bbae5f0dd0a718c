"""Ahead-of-time compilation of the real training and evaluation steps for accelerator
topologies this machine does not have (TPU slices through libtpu's compiler, or the local
GPUs): memory per chip, XLA's cost estimate and the collectives, before a run is launched."""
