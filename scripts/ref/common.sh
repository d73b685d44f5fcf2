# Sourced by the reference build scripts.

# The Python to use: $PYTHON, else the repository's .venv, else python3 (root as $1).
pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
    elif [ -x "$1/.venv/bin/python" ]; then
        echo "$1/.venv/bin/python"
    else
        echo python3
    fi
}

# The executable NAME inside the pip-installed tools: the wheels also install Python launcher
# scripts that only work on their own sys.path, so take the first native (ELF) binary.
tool_binary() {
    local dir=$1 f
    [ -d "$dir/tools" ] || return 0
    while IFS= read -r f; do
        if [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then
            echo "$f"
            return
        fi
    done < <(find "$dir/tools" -type f -name "$2" -perm -u+x)
}

# Sets CMAKE and NINJA to tools from PATH, or to native binaries pip-installed under $1/tools
# (with the Python $2) when PATH has none.
find_build_tools() {
    local dir=$1 py=$2
    CMAKE=$(command -v cmake || true)
    NINJA=$(command -v ninja || true)
    if [ -z "$CMAKE" ] || [ -z "$NINJA" ]; then
        if [ -z "$(tool_binary "$dir" cmake)" ] || [ -z "$(tool_binary "$dir" ninja)" ]; then
            "$py" -m pip install --quiet --target "$dir/tools" cmake ninja
        fi
        CMAKE=${CMAKE:-$(tool_binary "$dir" cmake)}
        NINJA=${NINJA:-$(tool_binary "$dir" ninja)}
    fi
}
