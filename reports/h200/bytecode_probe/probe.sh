# What ran on the H200 (from the checkout's root, at 08ea97a) to write probe.log and importtime.txt.
set -x
python -c "import sys,os; print('dont_write', sys.flags.dont_write_bytecode, os.environ.get('PYTHONDONTWRITEBYTECODE'), os.environ.get('PYTHONPYCACHEPREFIX'), sys.version)"
SP=$(python -c "import torch,os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
echo $SP; ls -ld $SP; touch $SP/.w && echo writable && rm $SP/.w
ls $SP/transformers/__pycache__ 2>&1 | head -3; ls $SP/torch/__pycache__ 2>&1 | head -3
mount | grep -E " / | /opt" | head
for i in 1 2; do /usr/bin/time -f "torch %e s" python -c "import torch"; done
for i in 1 2; do /usr/bin/time -f "transformers llama %e s" python -c "import torch; from transformers import LlamaForCausalLM"; done
python -X importtime -c "import torch; from transformers import LlamaForCausalLM" 2> $OUT/importtime.txt
python - <<'PY'
import inspect, torch.cuda.graphs as g
print("force_cudagraph_gc" in inspect.getsource(g.graph.__enter__), torch.__version__)
PY
export PYTHONPYCACHEPREFIX=/tmp/pyc
for i in 1 2; do /usr/bin/time -f "with prefix: transformers llama %e s" python -c "import torch; from transformers import LlamaForCausalLM"; done
