"""Shell completion for ``harmony`` (bash and zsh via bashcompinit), made
from the CLI's own argument parser: ``eval "$(harmony completion bash)"``."""
from __future__ import annotations

import argparse


def _tree(p: argparse.ArgumentParser, prefix: str, out: dict[str, list[str]]) -> None:
    words: list[str] = []
    for act in p._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sp in act.choices.items():
                words.append(name)
                _tree(sp, f"{prefix} {name}".strip(), out)
        else:
            words.extend(o for o in act.option_strings if o.startswith("--"))
            if act.choices and not act.option_strings:
                words.extend(str(c) for c in act.choices)
    out[prefix] = words


def bash_script(parser: argparse.ArgumentParser, prog: str = "harmony") -> str:
    tree: dict[str, list[str]] = {}
    _tree(parser, "", tree)
    cases = "\n".join(f'        "{k}") words="{" ".join(v)}" ;;' for k, v in sorted(tree.items()))
    return f'''# {prog} completion (bash; zsh: autoload bashcompinit && bashcompinit)
_{prog}_complete() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ "$w" == -* ]] && continue
        case "${{path:+$path }}$w" in
{chr(10).join(f'            "{k}") path="{k}" ;;' for k in sorted(tree) if k)}
        esac
    done
    local words=""
    case "$path" in
{cases}
    esac
    if [[ "$cur" == -* || -n "$words" ]]; then
        COMPREPLY=( $(compgen -W "$words" -- "$cur") )
    fi
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=( $(compgen -f -- "$cur") )
}}
complete -o filenames -F _{prog}_complete {prog}
'''
