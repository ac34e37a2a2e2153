#!/bin/sh
# envbuild: the environment's pip, run as `python -m pip`. The environment belongs to the image's
# user, so `FROM image` + `RUN pip install` works as it is; another uid (`docker run -u`, a USER line
# of a derived Dockerfile) is refused, and gets the fix after pip's own error (README: "Building on
# an envbuild image"). A failed install is told where a "(constraint)" comes from: PIP_CONSTRAINT,
# the tested torch and numpy, and where this torch build's torchvision and torchaudio are, when
# pip's explanation names them.
log=""
trap 'rm -f "$log"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ ! -t 1 ] && command -v tee >/dev/null && log=$(mktemp 2>/dev/null); then
    # pip explains a conflict on stdout ("The user requested (constraint) torchvision==0.28.0+cpu"),
    # or with -q only on stderr ("Cannot install torchvision because ..."): a copy of both is kept
    # to say only what applies, each still on its own stream. Not on a terminal, where a pipe would
    # cost pip its progress bars; there the lines below follow any failed install.
    exec 4>&1 6>&2
    code=$({ { { python -m pip "$@"; echo $? >&5; } | tee -a "$log" >&4; } 2>&1 | tee -a "$log" >&6; } 5>&1)
    exec 4>&- 6>&-
    code=${code:-1}
else
    python -m pip "$@"
    code=$?
fi
# Whether pip's output said it (case aside); without a copy of it, as if it had.
said() {
    [ -z "$log" ] || grep -qiE -- "$1" "$log"
}
# An install aimed elsewhere (--target, --prefix, --root, --user) failed for its own reason.
elsewhere=0
for arg in "$@"; do
    case "$arg" in
        -t | --target | --target=* | --prefix | --prefix=* | --root | --root=* | --user) elsewhere=1 ;;
    esac
done
if [ "$code" -ne 0 ] && [ "$elsewhere" -eq 0 ]; then
    for arg in "$@"; do
        case "$arg" in
            -*) continue ;;
            install | uninstall)
                site=""
                [ "$(id -u)" -ne 0 ] && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
                if [ -n "$site" ] && [ ! -w "$site" ]; then
                    echo "envbuild: $site belongs to uid $(stat -c %u "$site" 2>/dev/null || echo '?'), not to uid $(id -u): this user cannot change the environment." >&2
                    echo "envbuild: in a Dockerfile, put 'USER root' before this step and 'USER $(id -u):$(id -g)' after it." >&2
                    exit "$code"
                fi ;;
        esac
        if [ "$arg" = install ] && [ -n "${PIP_CONSTRAINT:-}" ] && said '\(constraint\)|conflicting dependencies'; then
            echo "envbuild: a \"(constraint)\" in pip's conflict is this image's tested torch build or numpy" \
                "($PIP_CONSTRAINT): change it in the profile and rebuild, or clear it for this install:" \
                "PIP_CONSTRAINT= pip install ..." >&2
            if ! said 'torch(vision|audio)'; then
                : # pip's conflict is not about torch's companions: where they are is no news
            elif [ -n "${ENVBUILD_TORCH_INDEX:-}" ]; then
                # the index already given: pip could not reach it, or it has no such release
                case " $* " in
                    *"$ENVBUILD_TORCH_INDEX"*) ;;
                    *) echo "envbuild: torchvision and torchaudio for this torch build are on $ENVBUILD_TORCH_INDEX," \
                        "not on PyPI: pip install --extra-index-url $ENVBUILD_TORCH_INDEX ..." >&2 ;;
                esac
            elif [ -n "${CONDA_PREFIX:-}" ]; then
                echo "envbuild: torchvision and torchaudio for this torch come from its conda channel, and PyPI's" \
                    "fail on import beside it (a \"<0\" constraint): add \`torchvision: auto\` (or torchaudio)" \
                    "to the profile and rebuild" >&2
            fi
        fi
        break
    done
fi
exit "$code"
