"""An example engine that is not vLLM: its own Llama, KV cache, bucket policy and FULL graphs.

    pytest suites/ --runtime bucket-engine       # after pip install -e examples/bucket_engine
    pytest suites/ --runtime bucket_engine.runtime:BucketRuntime

policy.py (buckets, dispatch, mode resolution; no torch), model.py (the Llama), engine.py (KV
cache, static buffers, graphs), runtime.py (the protocol object the suites talk to).
"""
__version__ = "0.1.0"
