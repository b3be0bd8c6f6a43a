"""Text that the report did not write itself (model responses, model names a server reported,
names read from another results directory) made inert before it goes into report.md.

GitHub-flavoured Markdown renders inline HTML, links and images, so a response holding
``</td></table><img src=...>`` or ``![x](https://...)`` would otherwise become live markup. Both
helpers keep such text on one line (line breaks shown as ⏎), so it can neither start a block of its
own (a heading, a quote, a fence) nor end the table row or list item it stands in, and show every
other control character as its escape (ESC as ``\\x1b``), so it cannot drive a terminal showing it.
"""

from __future__ import annotations

import re

from hf_securesd.bench.terminal import readable

LINE_BREAK = " ⏎ "
# characters replaced by HTML entities: no tag, comment or entity of the text's own can form, and no
# `$` delimits GitHub math (GitHub reads math delimiters in the source, where a backslash escape is
# not always honoured; an entity is never a delimiter)
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "$": "&#36;"}
# characters escaped with a backslash: code spans, emphasis, links and images, strikethrough, table cells
_MARKUP = frozenset("\\`*_[]~|")
# where GitHub would link a mention (@user), an issue (#123) or show an emoji (:smile:) in rendered text
_REFERENCE_START = re.compile(r"@(?=[A-Za-z0-9])|#(?=[0-9])|:(?=[\w+-]+:)")
# an invisible character that ends those references: GitHub finds them in the rendered text, so an
# escape or entity would not stop them
WORD_JOINER = "\u2060"


def one_line(text: str) -> str:
    """`text` with every line break (\\r\\n, \\r, \\n, and the Unicode line and paragraph separators
    U+2028 and U+2029, which editors and `str.splitlines` read as line ends) shown as ⏎ and every other
    control character and bidirectional override as its escape (`terminal.readable`: ``\\x1b``), stripped."""
    return readable(re.sub("\r\n|[\r\n\u2028\u2029]", LINE_BREAK, text).strip())


def inline_text(text: str) -> str:
    """`text` as literal Markdown on one line, safe in a table cell or a heading: `&`, `<` and `>`
    become HTML entities and every other character Markdown reads as markup is backslash-escaped
    (an underscore between two letters or digits is left as it is: it never starts or ends
    emphasis), so the rendered text shows exactly the characters of `text`. Model responses and
    the names a results file gives (configurations, schedules, tasks) both go through it. The ':' of
    a '://' and the '.' of a 'www.' are escaped too, so that GitHub does not turn a bare URL into a
    link (an e-mail address still shows as a mailto link whose text is the address itself); `$`
    becomes an entity (no GitHub math), and a word joiner (U+2060, invisible) follows the `@`, `#` or
    `:` that would start a mention, an issue reference or an emoji shortcode."""
    line = one_line(text)
    references = {match.start() for match in _REFERENCE_START.finditer(line)}
    return "".join(_shown(line, index) + (WORD_JOINER if index in references else "")
                   for index in range(len(line)))


def _shown(text: str, index: int) -> str:
    """`text[index]` as inline_text writes it: an entity, a backslash-escaped character, or itself."""
    char = text[index]
    return _ENTITIES.get(char) or ("\\" + char if _escaped(text, index) else char)


def _escaped(text: str, index: int) -> bool:
    """Whether `text[index]` gets a backslash: Markdown markup (but an intraword underscore) and the
    characters that let GitHub autolink a bare URL."""
    char = text[index]
    if char in _MARKUP:
        return not _intraword(text, index)
    if char == ":":
        return text.startswith("//", index + 1)
    return char == "." and index >= 3 and text[index - 3 : index].lower() == "www"


def _intraword(text: str, index: int) -> bool:
    """Whether `text[index]` is an underscore between two letters or digits."""
    return (text[index] == "_" and 0 < index < len(text) - 1
            and text[index - 1].isalnum() and text[index + 1].isalnum())


def table_code(text: str) -> str:
    """`text` as one inline code span inside a table cell (`code_span`, with `|` escaped: GitHub
    splits a row at `|` before it reads code spans)."""
    return code_span(text).replace("|", "\\|")


def code_span(text: str) -> str:
    """`text` as one inline code span outside a table (HTML and Markdown in it stay literal): the
    fence is one backtick longer than the longest run of backticks in `text`. In a table cell use
    `inline_text`: GitHub splits a row at `|` before it reads code spans."""
    text = one_line(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
