# Sourced by benchmarks/gpu_check.sh and gpu_study.sh, from the checkout's root: sets $py to
# the Python that runs them and puts the checkout (and carried wheels) on PYTHONPATH.
#
# Python: $PY if set, else .venv/bin/python when it exists, else python3 (a GPU image's JAX).
# Packages that Python lacks travel as wheels in .whl/ (benchmarks/gpu_wheels.sh fetches them
# on a machine with the package index); they are installed into a private folder first,
# without the network.
py=${PY:-}
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    site=$(mktemp -d)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        .whl/*.whl || exit 2
    export PYTHONPATH="$PYTHONPATH:$site"  # after the checkout, so the image's own JAX wins
fi
