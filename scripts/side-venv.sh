# Sourced by the scripts/setup-*-venv.sh scripts. side_venv DIR IMPORTS PACKAGE...: make (or reuse)
# the virtual environment DIR for what cannot share the main environment's versions, installing
# the PACKAGEs unless its Python already imports IMPORTS (comma-separated); prints its interpreter.
side_venv() {
    local venv=$1 imports=$2
    shift 2
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2
    fi
    echo "$venv/bin/python"
}
