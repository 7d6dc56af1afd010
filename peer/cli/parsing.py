"""The CLI's ArgumentParser: a typo gets the usage of the verb it was typed for and a "did you mean".

argparse alone leaves a verb's unknown flag to the top-level parser, which prints the top-level
usage (`swarmloco [-h] [-v] VERB ...`) and nothing close to what was meant. Here a verb's parser
refuses an unknown `--flag` itself, before anything else (a missing required flag included), with
the verb's usage line and the nearest of the verb's own options (difflib), or the verbs that do
take that flag; an unknown verb or choice value gets the nearest valid one. Exit status 2, as
argparse's own errors.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """"; did you mean X?" for the candidate closest to `word`, else ""."""
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class CliParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose verbs (add_subparsers makes them of this class too) refuse
    unknown options with their own usage and a suggestion."""

    def long_options(self) -> list[str]:
        """This parser's --options, hidden ones (a refused run-config flag) included."""
        return [option for option in self._option_string_actions if option.startswith("--")]

    def is_known(self, option: str) -> bool:
        """Would argparse take `option` (`--name` or `--name=value`): an exact option, or an
        abbreviation of one (ambiguous abbreviations are argparse's own error)."""
        name = option.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        return self.allow_abbrev and any(known.startswith(name) for known in self.long_options())

    def sibling_verbs(self) -> dict[str, "CliParser"]:
        """The other verbs of the program, by name (set by `CliParser.link_verbs`)."""
        return getattr(self, "_siblings", {})

    @staticmethod
    def link_verbs(subparsers: argparse._SubParsersAction) -> None:
        """Let every verb's parser name the verbs that take a flag it does not."""
        for parser in subparsers.choices.values():
            parser._siblings = {name: other for name, other in subparsers.choices.items() if other is not parser}

    def unknown_option_message(self, option: str) -> str:
        name = option.split("=", 1)[0]
        takers = [verb for verb, other in self.sibling_verbs().items() if name in other._option_string_actions]
        if takers:  # a run-config flag on the peer, say: which verbs it belongs to
            hint = f"; {name} is an option of {', '.join(takers)}, not of {self.prog.split()[-1]}"
        else:
            hint = did_you_mean(name, self.long_options())
        return f"unrecognized argument {option}{hint} (see {self.prog} --help)"

    def refuse_unknown_options(self, tokens: Sequence[str]) -> None:
        for token in tokens:
            if token == "--" or (self._subparsers is not None and not token.startswith("-")):
                break  # past "--", or (top level) at the verb: the rest is the verb's
            if token.startswith("--") and not self.is_known(token):
                self.error(self.unknown_option_message(token))

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):
        args = sys.argv[1:] if args is None else list(args)
        self.refuse_unknown_options(args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:  # a stray value after a verb: that verb's usage
            self.error(f"unrecognized arguments: {' '.join(extras)} (see {self.prog} --help)")
        return namespace, extras

    def _check_value(self, action: argparse.Action, value) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            if not isinstance(value, str) or not action.choices:
                raise
            raise argparse.ArgumentError(action, exc.message + did_you_mean(value, map(str, action.choices))) from None
