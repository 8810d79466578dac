"""The reference runtime: an executable specification of CUDA-graph decode.

`reference_runtime.policy` is pure Python (sizes, padding, dispatch, resolution);
the engine beside it runs the model eagerly, PIECEWISE or FULL.
"""
__version__ = "0.1.0"
