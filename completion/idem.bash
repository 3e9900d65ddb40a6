# bash completion for idem(1): commands, each command's options, and the
# values some options take; --store offers IDEM_STORE, the URL schemes and
# files. Installed as share/bash-completion/completions/idem; the option
# lists are kept in step with each command's --help by
# tests/completion.sh.

# _idem_options COMMAND: the options COMMAND takes.
_idem_options() {
  case $1 in
    lab) echo --store --output --suite --help ;;
    canon) echo --hash -n --help ;;
    run)
      echo --key --tenant --store --lease --retention --on-unknown \
        --max-output --kill-after --stdin --max-input --stdin-wait --help
      ;;
    serve)
      echo --listen --upstream --store --create-store --principal \
        --tenant-header --jwks --issuer --audience --replay-check-url \
        --replay-check-ttl --seal-key --require-key --methods --lease \
        --retention --attach-wait --no-store-5xx --on-unknown \
        --keep-requests --max-body --max-response --upstream-timeout \
        --upstream-cacert --admin-listen --admin-token-file \
        --console-token-file --console-audit-log --log --threads --store-workers \
        --header-timeout --max-connections --max-connections-per-client \
        --help
      ;;
    mcp)
      echo --store --tenant --require-key --key-argument \
        --offer-key-argument --implicit-keys --lease --retention \
        --keyed-cancel --cancel-wait --on-unknown --attach-wait \
        --store-tool-errors --input-wait --max-result --keep-requests \
        --seal-key --drain-wait --shutdown-wait --listen --upstream \
        --principal --tenant-header --jwks --issuer --audience \
        --replay-check --replay-check-ttl --max-body --call-timeout \
        --allow-origin --help
      ;;
    keys)
      echo --store --seal-key --tenant --operation --state --limit \
        --expired --overdue --json --force --completed --status --body \
        --retention --failed --help
      ;;
    console)
      echo --store --listen --token-file --audit-log --seal-key --help
      ;;
    bench) echo --store --workers --seconds --json --help ;;
  esac
}

# _idem_flag COMMAND OPTION: true when OPTION takes no value.
_idem_flag() {
  case "$1 $2" in
    "canon --hash" | "canon -n" | "serve --create-store" | \
      "serve --require-key" | "serve --no-store-5xx" | \
      "serve --keep-requests" | "mcp --require-key" | \
      "mcp --keep-requests" | "keys --expired" | "keys --overdue" | \
      "keys --json" | "keys --force" | "keys --completed" | \
      "keys --failed" | "bench --json" | *" --help")
      return 0
      ;;
  esac
  return 1
}

# _idem_store CUR: the store URLs: IDEM_STORE's, the schemes, files.
_idem_store() {
  local cur=$1 f
  if [[ -n ${IDEM_STORE-} && $IDEM_STORE == "$cur"* ]]; then
    COMPREPLY+=("$IDEM_STORE")
  fi
  case $cur in
    sqlite:*)
      while IFS= read -r f; do
        [[ -d $f ]] && f=$f/
        COMPREPLY+=("sqlite:$f")
      done < <(compgen -f -- "${cur#sqlite:}")
      ;;
    postgres*) [[ postgresql:// == "$cur"* ]] && COMPREPLY+=(postgresql://) ;;
    *)
      local w
      for w in sqlite: postgresql://; do
        [[ $w == "$cur"* ]] && COMPREPLY+=("$w")
      done
      while IFS= read -r f; do
        [[ -d $f ]] && f=$f/
        COMPREPLY+=("$f")
      done < <(compgen -f -- "$cur")
      ;;
  esac
  compopt -o nospace 2>/dev/null
}

# _idem_value COMMAND PREV CUR: completes the value of option PREV; false
# when PREV is no option that takes one.
_idem_value() {
  local cmd=$1 prev=$2 cur=$3
  case $prev in
    --store)
      _idem_store "$cur"
      ;;
    --on-unknown)
      if [[ $cmd == run ]]; then
        COMPREPLY=($(compgen -W "fail rerun" -- "$cur"))
      else
        COMPREPLY=($(compgen -W "forward fail" -- "$cur"))
      fi
      ;;
    --stdin) COMPREPLY=($(compgen -W "hash ignore" -- "$cur")) ;;
    --keyed-cancel) COMPREPLY=($(compgen -W "hold pass" -- "$cur")) ;;
    --store-tool-errors) COMPREPLY=($(compgen -W "yes no" -- "$cur")) ;;
    --replay-check) COMPREPLY=($(compgen -W "upstream none" -- "$cur")) ;;
    --principal)
      COMPREPLY=($(compgen -W "credential:authorization credential: \
        header: jwt none" -- "$cur"))
      [[ ${COMPREPLY[0]-} == *: ]] && compopt -o nospace 2>/dev/null
      ;;
    --suite)
      COMPREPLY=($(compgen -W "tool-retries account-credit recovery" \
        -- "$cur"))
      ;;
    --state)
      COMPREPLY=($(compgen -W "in_progress completed unknown" -- "$cur"))
      ;;
    --methods) COMPREPLY=($(compgen -W "POST PATCH PUT DELETE" -- "$cur")) ;;
    --seal-key | --output | --log | --jwks | --body | --admin-token-file | \
      --console-token-file | --console-audit-log | --upstream-cacert | --token-file | --audit-log)
      compopt -o filenames 2>/dev/null
      COMPREPLY=($(compgen -f -- "$cur"))
      ;;
    -*)
      # Any other option that takes a value: nothing to offer.
      _idem_flag "$cmd" "$prev" && return 1
      [[ " $(_idem_options "$cmd") " == *" $prev "* ]] || return 1
      ;;
    *) return 1 ;;
  esac
  return 0
}

_idem() {
  local cur prev words cword
  if declare -F _init_completion >/dev/null 2>&1; then
    # -n : keeps sqlite:PATH and postgresql://... one word.
    _init_completion -n : || return
  else
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
  fi
  COMPREPLY=()

  # The command: the first word after idem that is not an option.
  local cmd="" i
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      --version | --help) ;;
      -*) ;;
      *)
        cmd=${words[i]}
        break
        ;;
    esac
  done
  if [[ -z $cmd ]]; then
    COMPREPLY=($(compgen -W "lab canon run serve mcp keys console bench \
      help --version --help" -- "$cur"))
    return
  fi
  if [[ $cmd == help ]]; then
    ((cword == i + 1)) &&
      COMPREPLY=($(compgen -W "lab canon run serve mcp keys console bench" \
        -- "$cur"))
    return
  fi
  # After `--` (idem run, idem mcp): the command to run.
  local j
  for ((j = i + 1; j < cword; j++)); do
    if [[ ${words[j]} == -- ]]; then
      COMPREPLY=($(compgen -c -- "$cur"))
      return
    fi
  done
  # idem keys: the subcommand first.
  if [[ $cmd == keys && $cword == $((i + 1)) ]]; then
    COMPREPLY=($(compgen -W "list show prune resolve delete" -- "$cur"))
    return
  fi

  # The value of the option before the cursor, else an option.
  if _idem_value "$cmd" "$prev" "$cur"; then
    :
  elif [[ $cur == -* || $cmd == serve || $cmd == lab || $cmd == bench ||
    $cmd == console || ($cmd == keys && $cword -gt $((i + 1))) ]]; then
    COMPREPLY=($(compgen -W "$(_idem_options "$cmd")" -- "$cur"))
  elif [[ $cmd == canon ]]; then
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
  if declare -F __ltrim_colon_completions >/dev/null 2>&1; then
    __ltrim_colon_completions "$cur"
  fi
}
complete -F _idem idem
