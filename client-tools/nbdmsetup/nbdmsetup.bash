# SPDX-License-Identifier: BSD-3-Clause
# Bash completion for nbdmsetup(8): commands, options, and the names,
# uuids and target types of the server's devices when the control
# export is known (-a/--connect on the line, else $NBDMSETUP_URI; the
# key from -k/--key, else $NBDMSETUP_KEY).  Installed as "nbdmsetup" in
# bash-completion's directory, which loads it on first use; or source it.
# Needs nothing of bash-completion itself.

# The commands that apply (nbdmsetup refuses dmsetup's others, saying
# why): test-nbdmsetup-completion.sh checks this is nbdmsetup's list.
_nbdmsetup_verbs='version ls create load reload clear suspend resume
  replace remove remove_all wipe_table rename info deps table status
  message targets target-version wait stats clients move batch help'
# Options that take a value (the next word is not a command or NAME).
_nbdmsetup_valued='-a|--connect|-k|--key|-o|--options|-O|--sort|-u|--uuid|--separator|--target|--table|--timeout|--region|--method|--log|--metadata|--region-size'
_nbdmsetup_global='-a --connect -k --key --json -v --verbose -y --yes
  --timeout -h --help -V --version --'
_nbdmsetup_fields='name uuid attr tables_loaded suspended readonly open
  segments events device_count devs_used blkdevs_used device_ref_count
  names_using_dev help'

# The options of one command (nbdmsetup refuses the others).
_nbdmsetup_verb_opts ()
{
    case "$1" in
        ls) echo "--target --tree -o --options" ;;
        create) echo "-u --uuid --table -n --notable -r --readonly" ;;
        load|reload|replace) echo "--table -r --readonly -u --uuid" ;;
        suspend) echo "--noflush -u --uuid" ;;
        remove) echo "-f --force -u --uuid" ;;
        remove_all) echo "-f --force" ;;
        info) echo "-c -C --columns -o --options -O --sort --noheadings
                    --separator --nameprefixes -u --uuid" ;;
        deps) echo "-o --options -u --uuid" ;;
        table) echo "--inactive --showkeys --target -u --uuid" ;;
        status) echo "--backends --target --noflush -u --uuid" ;;
        wait) echo "--noflush -u --uuid" ;;
        stats) echo "--clear --region --prometheus -u --uuid" ;;
        clients) echo "-u --uuid" ;;
        move) echo "--resume --abort --method --log --metadata --region-size
                    -u --uuid" ;;
        help) echo "-c -C --columns" ;;
        clear|resume|wipe_table|rename|message) echo "-u --uuid" ;;
    esac
}

# Run nbdmsetup against the server of the line being completed; nothing
# (and no error) without one, or when it does not answer within 2 s.
_nbdmsetup_query ()
{
    local i uri=${NBDMSETUP_URI:-} key=${NBDMSETUP_KEY:-}
    for (( i = 1; i < COMP_CWORD; i++ )); do
        case "${COMP_WORDS[i]}" in
            -a|--connect) uri=${COMP_WORDS[i+1]:-} ;;
            --connect=*) uri=${COMP_WORDS[i]#--connect=} ;;
            -k|--key) key=${COMP_WORDS[i+1]:-} ;;
            --key=*) key=${COMP_WORDS[i]#--key=} ;;
        esac
    done
    [ -n "$uri" ] || return 0
    # The words are as typed: undo quotes around a URI (without eval: the
    # line is not run while it is being completed).
    case "$uri" in
        \'*\') uri=${uri:1:${#uri}-2} ;;
        \"*\") uri=${uri:1:${#uri}-2} ;;
    esac
    NBDMSETUP_URI=$uri NBDMSETUP_KEY=$key NBDMSETUP_TIMEOUT=2 \
        "${COMP_WORDS[0]}" "$@" 2>/dev/null
}

# Add the words of stdin (one a line) that start with $cur to COMPREPLY,
# quoted for the shell (device names may hold blanks).  Not at the end
# of a pipe, where it would run in a subshell: < <(...).
_nbdmsetup_add_lines ()
{
    local w
    while IFS= read -r w; do
        [ -n "$w" ] && [[ $w == "$cur"* ]] && COMPREPLY+=("$(printf '%q' "$w")")
    done
}

_nbdmsetup ()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local verb= nargs=0 i w ended=false
    COMPREPLY=()

    # The command and how many of its arguments come before cur.
    for (( i = 1; i < COMP_CWORD; i++ )); do
        w=${COMP_WORDS[i]}
        if ! $ended && [ "$w" = -- ]; then ended=true; continue; fi
        if ! $ended && [[ $w =~ ^($_nbdmsetup_valued)$ ]]; then
            (( i++ )); continue
        fi
        if ! $ended && [[ $w == -* ]]; then continue; fi
        if [ -z "$verb" ]; then verb=$w; else (( nargs++ )); fi
    done

    case "$prev" in
        -k|--key) compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return 0 ;;
        -a|--connect|--table|--timeout|--separator|--region|--region-size)
            return 0 ;;
        --method)
            mapfile -t COMPREPLY < <(compgen -W "mirror clone" -- "$cur")
            return 0 ;;
        --log|--metadata)
            # --log: core, or a disk log's device.
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
            [ "$prev" = --metadata ] ||
                mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -W core -- "$cur")
            return 0 ;;
        --target)
            _nbdmsetup_add_lines < <(_nbdmsetup_query targets | awk '{print $1}')
            return 0 ;;
        -u|--uuid)
            [ "$verb" = create ] && return 0
            _nbdmsetup_add_lines < <(_nbdmsetup_query info -c --noheadings -o uuid)
            return 0 ;;
        -o|--options|-O|--sort)
            local words=$_nbdmsetup_fields pre=
            [ "$verb" = ls ] && words='ascii utf active open rw uuid notrunc'
            [ "$verb" = deps ] && words='devname blkdevname'
            # A comma-separated list: complete its last element (for -O,
            # after a '-' for a reverse sort).
            local last=${cur##*,} c
            if [[ $cur == *,* ]]; then pre=${cur%,*},; fi
            if [[ $prev == -O || $prev == --sort ]] && [[ $last == -* ]]; then
                pre=$pre-; last=${last#-}
            fi
            for c in $(compgen -W "$words" -- "$last"); do
                COMPREPLY+=("$pre$c")
            done
            return 0 ;;
    esac

    if [[ $cur == -* ]] && ! $ended; then
        mapfile -t COMPREPLY < <(compgen -W \
            "$_nbdmsetup_global $(_nbdmsetup_verb_opts "$verb")" -- "$cur")
        return 0
    fi
    if [ -z "$verb" ]; then
        mapfile -t COMPREPLY < <(compgen -W "$_nbdmsetup_verbs" -- "$cur")
        return 0
    fi
    case "$verb:$nargs" in
        create:0|rename:1|message:*|version:*|targets:*|remove_all:*|help:*|ls:*)
            ;;
        create:1|load:1|reload:1|replace:1|batch:0|move:1)
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
        target-version:*)
            _nbdmsetup_add_lines < <(_nbdmsetup_query targets | awk '{print $1}') ;;
        *:0)
            # Every other command's first argument is a device.
            _nbdmsetup_add_lines < <(_nbdmsetup_query ls |
                                     grep -vx 'No devices found') ;;
    esac
    return 0
}
complete -F _nbdmsetup nbdmsetup
