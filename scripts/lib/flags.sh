# flags.sh — default train_gpt flags that yield to the caller's: the trainer refuses a flag given
# twice, so a script's default is dropped when the caller gives the same flag (--flag V or --flag=V).
# shellcheck shell=bash

# usage: defaults_not_given GIVEN FLAG VALUE [FLAG VALUE]...
#   GIVEN names an array of the caller's arguments; sets the array `defaults` to the FLAG VALUE
#   pairs whose FLAG is not among them.
defaults_not_given() {
  local -n given_args=$1
  shift
  defaults=()
  while [ $# -gt 0 ]; do
    local given=0 a
    for a in "${given_args[@]}"; do [[ $a == "$1" || $a == "$1="* ]] && given=1; done
    [ $given -eq 1 ] || defaults+=("$1" "$2")
    shift 2
  done
}

# usage: flag_value ARRAY FLAG → prints FLAG's value in the named array (--flag V or --flag=V), or
# nothing; the last occurrence wins.
flag_value() {
  local -n flag_args=$1
  local i value=
  for ((i = 0; i < ${#flag_args[@]}; i++)); do
    if [ "${flag_args[i]}" = "$2" ] && [ $((i + 1)) -lt ${#flag_args[@]} ]; then value=${flag_args[i + 1]}
    elif [[ ${flag_args[i]} == "$2="* ]]; then value=${flag_args[i]#*=}; fi
  done
  printf '%s' "$value"
}
