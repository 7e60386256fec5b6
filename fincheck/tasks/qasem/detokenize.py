"""Turn QASem's token lists back into readable text ("year 's event ." -> "year's event.")."""

from __future__ import annotations

_CLITICS = ("'s", "'S", "n't", "N'T", "'re", "'ve", "'ll", "'d", "'m")
_NO_SPACE_BEFORE = {*".,;:!?)]}%", "...", "''", *_CLITICS}
_NO_SPACE_AFTER = {"(", "[", "{", "$", "``", "£", "#"}


def detokenize(tokens: list[str]) -> str:
    out: list[str] = []
    quote_open = False  # straight double quotes alternate between opening and closing
    glue_next = False
    for i, token in enumerate(tokens):
        space = bool(out) and not glue_next
        # a hyphen between two words joins them: "24 - year - old" -> "24-year-old"
        hyphen = (
            token == "-"
            and 0 < i < len(tokens) - 1
            and tokens[i - 1][-1:].isalnum()
            and tokens[i + 1][:1].isalnum()
        )
        if token in _NO_SPACE_BEFORE or hyphen:
            space = False
        elif token == '"':
            if quote_open:
                space = False
            quote_open = not quote_open
        out.append(" " + token if space else token)
        glue_next = hyphen or token in _NO_SPACE_AFTER or (token == '"' and quote_open)
    return "".join(out)
