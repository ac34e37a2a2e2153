#!/bin/sh
# envbuild: the environment's pip, run as `python -m pip`. The environment belongs to root, so the
# image's user cannot change what the smoke test certified; an install it is refused gets the fix
# for a derived Dockerfile after pip's own error (README: "Building on an envbuild image").
python -m pip "$@"
code=$?
# An install aimed elsewhere (--target, --prefix, --root, --user) failed for its own reason.
elsewhere=0
for arg in "$@"; do
    case "$arg" in
        -t | --target | --target=* | --prefix | --prefix=* | --root | --root=* | --user) elsewhere=1 ;;
    esac
done
if [ "$code" -ne 0 ] && [ "$elsewhere" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
    for arg in "$@"; do
        case "$arg" in
            -*) continue ;;
            install | uninstall)
                site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
                if [ -n "$site" ] && [ ! -w "$site" ]; then
                    echo "envbuild: $site belongs to root: the image's user cannot change the tested environment." >&2
                    echo "envbuild: in a Dockerfile, put 'USER root' before this step and 'USER $(id -u):$(id -g)' after it." >&2
                fi ;;
        esac
        break
    done
fi
exit "$code"
