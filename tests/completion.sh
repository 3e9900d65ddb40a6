#!/bin/sh
# The shell completions (completion/): the bash one, sourced with
# bash-completion as an interactive shell loads it, completes commands,
# each command's options, option values and store URLs (IDEM_STORE's
# first); the options it and the zsh one offer for each command are the
# options that command's --help names; the zsh one parses.
#
# Usage: completion.sh IDEM COMPLETION_DIR
IDEM=$1
DIR=$(cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

BASH_COMPLETION=/usr/share/bash-completion/bash_completion
[ -f "$BASH_COMPLETION" ] && ok ||
  fail "$BASH_COMPLETION is missing (scripts/deps.sh check installs bash-completion)"

# complete LINE: the completions of LINE (the cursor at its end), one a
# line, sorted, as bash would offer them: COMP_WORDS split at spaces and
# colons (COMP_WORDBREAKS), COMP_CWORD the last word.
complete_line() {
  bash --norc --noprofile -c '
    . "$1" 2>/dev/null
    . "$2"
    line=$3
    COMP_LINE=$line
    COMP_POINT=${#line}
    read -ra parts <<< "$line"
    [[ $line == *" " ]] && parts+=("")
    COMP_WORDS=()
    for p in "${parts[@]}"; do
      while [[ $p == *:* ]]; do
        [[ -n ${p%%:*} ]] && COMP_WORDS+=("${p%%:*}")
        COMP_WORDS+=(":")
        p=${p#*:}
      done
      [[ -n $p || ${#COMP_WORDS[@]} == 0 || ${COMP_WORDS[-1]} != ":" ]] &&
        COMP_WORDS+=("$p")
    done
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    _idem idem "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    printf "%s\n" "${COMPREPLY[@]}" | sort -u
  ' completion "$BASH_COMPLETION" "$DIR/idem.bash" "$1"
}

# options FILE: the options named in FILE, sorted (as in man_options.sh).
options() {
  grep -oE -- '(^|[^A-Za-z0-9_-])--?[a-z][a-z0-9-]*' "$1" |
    sed -E 's/^[^-]*//' | grep -vxE -- '--help|-h' | sort -u
}

bash -n "$DIR/idem.bash" && ok || fail "idem.bash does not parse"

got=$(complete_line "idem " | tr '\n' ' ')
expect_eq "commands" "--help --version bench canon console help keys lab mcp run serve " "$got"
expect_eq "a command's prefix" "serve" "$(complete_line "idem se")"
expect_eq "idem help's commands" "keys" "$(complete_line "idem help k")"
expect_eq "idem keys' subcommands" "delete list prune resolve show " \
  "$(complete_line "idem keys " | tr '\n' ' ')"

# Each command's options: those its --help names (and --help).
for cmd in lab canon run serve mcp keys console bench; do
  "$IDEM" "$cmd" --help > "$TMP/help" 2>&1
  options "$TMP/help" > "$TMP/want"
  sub=""
  [ "$cmd" = keys ] && sub=" list"
  complete_line "idem $cmd$sub -" > "$TMP/bash.all"
  grep -vxE -- '--help' "$TMP/bash.all" > "$TMP/bash"
  expect_eq "bash: options of idem $cmd beyond its --help" "" \
    "$(comm -13 "$TMP/want" "$TMP/bash" | tr '\n' ' ')"
  expect_eq "bash: options of idem $cmd --help it does not offer" "" \
    "$(comm -23 "$TMP/want" "$TMP/bash" | tr '\n' ' ')"
  grep -qx -- --help "$TMP/bash.all" && ok || fail "bash: idem $cmd --help"
  # zsh: the options of the command's function.
  sed -n "/^_idem_$cmd() {/,/^}/p" "$DIR/_idem" > "$TMP/zfunc"
  options "$TMP/zfunc" > "$TMP/zsh"
  expect_eq "zsh: options of idem $cmd beyond its --help" "" \
    "$(comm -13 "$TMP/want" "$TMP/zsh" | tr '\n' ' ')"
  expect_eq "zsh: options of idem $cmd --help it does not offer" "" \
    "$(comm -23 "$TMP/want" "$TMP/zsh" | tr '\n' ' ')"
done
expect_eq "options by prefix" "--max-connections --max-connections-per-client " \
  "$(complete_line "idem serve --max-c" | tr '\n' ' ')"

# Option values.
expect_eq "idem run --on-unknown" "fail rerun " \
  "$(complete_line "idem run --on-unknown " | tr '\n' ' ')"
expect_eq "idem serve --on-unknown" "fail forward " \
  "$(complete_line "idem serve --on-unknown " | tr '\n' ' ')"
expect_eq "idem mcp --keyed-cancel" "hold pass " \
  "$(complete_line "idem mcp --keyed-cancel " | tr '\n' ' ')"
expect_eq "idem keys list --state" "completed in_progress unknown " \
  "$(complete_line "idem keys list --state " | tr '\n' ' ')"
expect_eq "nothing for a value without choices" "" \
  "$(complete_line "idem run --key ")"
expect_match "the command after --" "^echo$" \
  "$(complete_line "idem run --key k -- ech")"

# Store URLs: IDEM_STORE's first, the schemes, then files; after sqlite:,
# files (bash shows what follows the colon).
mkdir "$TMP/stores" && : > "$TMP/stores/orders.db"
got=$(IDEM_STORE=postgresql://idem@db/idem complete_line "idem serve --store " |
  tr '\n' ' ')
expect_match "--store offers IDEM_STORE" "(^| )postgresql://idem@db/idem " "$got"
expect_match "--store offers sqlite:" "(^| )sqlite: " "$got"
got=$(IDEM_STORE=postgresql://idem@db/idem complete_line "idem keys list --store postgresql://i")
expect_eq "IDEM_STORE by its prefix, after the colon" "//idem@db/idem" "$got"
got=$(cd "$TMP" && complete_line "idem run --store sqlite:stores/or")
expect_eq "a file after sqlite:" "stores/orders.db" "$got"
got=$(cd "$TMP" && complete_line "idem keys list --store stores/")
expect_eq "a bare path" "stores/orders.db" "$got"

# Files for the options that take one.
for opt in "console --token-file" "console --audit-log" "console --seal-key" \
  "serve --console-token-file" "serve --console-audit-log" "serve --admin-token-file"; do
  got=$(cd "$TMP" && complete_line "idem $opt stores/or")
  expect_eq "idem $opt: a file" "stores/orders.db" "$got"
done
expect_eq "idem console --listen: nothing to offer" "" \
  "$(complete_line "idem console --listen ")"
expect_match "idem console: its options without a dash" "(^| )--listen " \
  "$(complete_line "idem console --store x.db " | tr '\n' ' ')"

# zsh: the function parses, and loads through compinit.
if command -v zsh >/dev/null 2>&1; then
  zsh -n "$DIR/_idem" && ok || fail "_idem does not parse"
  out=$(zsh -f -c 'fpath=("$1" $fpath); autoload -Uz compinit; compinit -u -d "$2/zcompdump"; print -r -- "$_comps[idem]"' \
    zsh "$DIR" "$TMP" 2>&1)
  expect_eq "compinit binds _idem to idem" "_idem" "$out"
else
  fail "zsh is missing (scripts/deps.sh check installs it)"
fi
finish
