"""Reading a config: a YAML file and `key=value` overrides, onto the typed dataclasses of training/config.py.

What was typed is what is used. PyYAML reads YAML 1.1, where `017` is 15, `1:30` is 90, `on` is true and
`1e-3` is text; here an unquoted value keeps its text and the key's type decides what it means
(`read_plain`): a number reads as a reader would read it, and a form YAML 1.1 reads otherwise is refused
with what to write. No key is known here by name: a section is a dataclass and a key its field, so a key
added to the schema is read without a line in this file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from utils.checks import mistyped_word

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
OTHER_KEYS = "takes_the_section's_other_keys"


class ConfigError(ValueError):
    """A config that cannot be read or run; its message is the one line the user sees."""


class PlainText(str):
    """The text of an unquoted YAML scalar, as typed: the key's type decides what it means (read_plain)."""


PLAIN_TAG = "tag:crnn-ocr,plain"
NULLS = ("", "null", "Null", "NULL")  # `~` too in YAML; for a path key it would read as the home folder
BOOLEANS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")
# A real number as Python and YAML 1.2 write it (`1e-3` too), or infinity and NaN (`.inf`, `nan`: the
# range checks in training/config.py's `validate` then name the key).
REAL = re.compile(
    r"[-+]?(([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+" r"|\.?(?i:inf|infinity|nan))"
)


def real(text: str) -> float:
    """A text REAL matches, as a float: YAML's `.inf` and `.nan` are Python's `inf` and `nan`."""
    return float(re.sub(r"\.(?=[iInN])", "", text))


def decimal_or_octal(text: str, reading: Any) -> str:
    """What to write for `017`: the decimal number, and PyYAML's octal reading where that differs."""
    decimal = int(text.replace("_", ""), 10)
    octal = f", or {reading} if you meant octal" if isinstance(reading, int) and reading != decimal else ""
    return f"{decimal}{octal}"


def prefixed_number(text: str, reading: Any) -> str:
    """What to write for `0x1F`: its value in decimal, if it is a number in its base."""
    try:
        return str(int(text, 0))
    except ValueError:
        return "a decimal number"


# Forms that YAML 1.1, YAML 1.2 or Python read otherwise than a person does: (pattern, why, what to
# write instead, from the text and PyYAML's reading of it).
AMBIGUOUS: tuple[tuple[re.Pattern, str, Callable[[str, Any], str]], ...] = (
    (
        re.compile(r"(?i)yes|no|on|off|y|n"),
        "YAML 1.1 reads yes/no/on/off as true/false",
        lambda text, reading: "true or false",
    ),
    (re.compile(r"[-+]?0[0-9_]+"), "a leading 0 makes it octal in YAML 1.1", decimal_or_octal),
    (
        re.compile(r"[-+]?0[xob][0-9a-fA-F_]*"),
        "a 0x, 0o or 0b prefix: YAML 1.1 reads 0x and 0b, not 0o",
        prefixed_number,
    ),
    (
        re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"),
        "YAML 1.1 reads numbers with ':' in base 60",
        lambda text, reading: f"{reading}, the value in decimal, if that is what you meant",
    ),
    (
        re.compile(r"[-+]?[0-9._]*_[0-9._]*([eE][-+]?[0-9]+)?"),
        "YAML 1.1 drops the '_', YAML 1.2 reads text",
        lambda text, reading: text.replace("_", ""),
    ),
    (
        re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*"),
        "YAML reads it as a date",
        lambda text, reading: f"'{text}', quoted",
    ),
)


# A config is a page of keys; a file far larger is not one (and is not read into memory to find out).
MAX_CONFIG_BYTES = 1 << 20


class NoAliases:
    """A YAML loader that refuses aliases (`*name`): ten nested anchors of ten aliases each (a "billion
    laughs") expand a 500-byte file into a tree of 10^10 nodes. No config needs them: write the values out."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(
                f"{self.name}:{event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not read: "
                f"write the values out"
            )
        return super().compose_node(parent, index)


class SafeLoaderWithoutAliases(NoAliases, yaml.SafeLoader):
    """yaml.safe_load's types, without aliases: for a config.yaml this project wrote (a run folder's)."""


def safe_load_config(text: str, name: str) -> Any:
    """yaml.safe_load for a config written by this project, refusing aliases (ConfigError naming `name`)."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: {len(text):,} characters is not a config (the limit is {MAX_CONFIG_BYTES:,})")
    loader = SafeLoaderWithoutAliases(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class ConfigLoader(NoAliases, yaml.SafeLoader):
    """yaml.safe_load without aliases (NoAliases), except that an unquoted value keeps its text (PlainText),
    and a key given twice in one mapping is an error: PyYAML keeps the last one silently, so a second
    `train:` section would drop every key of the first."""

    # Every unquoted scalar resolves to PlainText, instead of YAML 1.1's booleans, octal and base-60 numbers.
    yaml_implicit_resolvers = {None: [(PLAIN_TAG, re.compile(r".*", re.DOTALL))]}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"{self.name}:{line}: {key!r} is given twice in the same section (first at line "
                    f"{seen[key]}); YAML would keep only the last: merge them into one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


ConfigLoader.add_constructor(PLAIN_TAG, lambda loader, node: PlainText(node.value))


def parse_yaml(text: str, name: str) -> Any:
    loader = ConfigLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def resolve_config_path(name: str) -> Path:
    """A path as given, or a bare name (`crnn.yaml`, `crnn`) looked up in configs/. A bare name that is a
    file here and a different file in configs/ is refused: which one a run read would depend on the folder
    it was started from, and the log would show only the values."""
    if Path(name).is_dir():
        raise ConfigError(f"--config {name} is a folder; give a YAML file (or a name in {CONFIG_DIR})")
    found = [path for path in (Path(name), CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml") if path.is_file()]
    if not found:
        raise ConfigError(f"config file {name!r} not found (looked in the current folder and in {CONFIG_DIR})")
    here, *shipped = found
    bare = Path(name).name == name
    if bare and shipped and here == Path(name) and not here.samefile(shipped[0]):
        if here.read_bytes() != shipped[0].read_bytes():
            raise ConfigError(
                f"--config {name} names both ./{name} and {shipped[0]}, which differ; say which: "
                f"--config ./{name} or --config {shipped[0]}"
            )
    return here


def read_config_file(path: Path) -> dict:
    """A config file's sections, refusing repeated keys and aliases; errors name the file (and line)."""
    try:
        size = path.stat().st_size
        if path.is_file() and size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {size:,} bytes is not a config (the limit is {MAX_CONFIG_BYTES:,}); give the YAML "
                f"file of the run's settings"
            )
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error}); re-save it as UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder; give a YAML file") from None
    try:
        values = parse_yaml(text, str(path))
    except yaml.YAMLError as error:
        raise ConfigError(describe_yaml_error(error, path)) from None
    if values is None:  # an empty file, or comments only: it would silently train the defaults
        raise ConfigError(
            f"{path} holds no keys; give the config you meant, or leave out --config to train with the defaults"
        )
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return values


def describe_yaml_error(error: yaml.YAMLError, path: Path) -> str:
    """PyYAML's multi-line report as one line: the file and line, and what is wrong there."""
    mark = getattr(error, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark else str(path)
    what = "; ".join(part for part in (getattr(error, "context", None), getattr(error, "problem", None)) if part)
    tabs = "; indent with spaces: YAML does not allow tabs there" if "'\\t'" in what else ""
    return f"{where}: not valid YAML: {what or error}{tabs}"


def apply_overrides(config: Any, overrides: list[str]) -> None:
    """The command line's `key=value` overrides, each value read as in a file."""
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep and override.endswith((".yaml", ".yml")):
            raise ConfigError(
                f"override {override!r}: expected key=value; to read a config file, give --config {override}"
            )
        if not sep or not key:
            raise ConfigError(f"override {override!r}: expected key=value, e.g. optim.lr=3e-4")
        set_value(config, key.strip(), text, source="command line")


def expand_paths(config: Any, path_keys: dict[str, tuple[str, ...]]) -> None:
    """`~` is the home folder in every key of `path_keys` (the shell leaves `train.out_dir=~/runs` alone: it
    is not an assignment); an empty path is refused, as it would mean the working folder, unless it is one
    of the words the key takes besides a path."""
    for key, words in path_keys.items():
        section, name = key.rsplit(".", 1)
        node = getattr(config, section)
        value = getattr(node, name)
        paths = value if isinstance(value, list) else [value]
        for i, item in enumerate(paths):
            where = f"{key}[{i}]" if isinstance(value, list) else key
            if not item.strip() and item not in words:
                settings = f", or {' or '.join(repr(word) for word in words)}" if words else ""
                raise ConfigError(f"{where} is empty: give a path{settings}")
            meant = mistyped_word(item, words)
            if meant:  # `train.resume=auot` would otherwise be "checkpoint auot does not exist"
                raise ConfigError(f"{where}={item}: no such file or folder, nor a setting; did you mean {meant}?")
        expanded = [item if item in words else os.path.expanduser(item) for item in paths]
        setattr(node, name, expanded if isinstance(value, list) else expanded[0])


def schema_fields(node: Any) -> dict[str, dataclasses.Field]:
    """A section's keys with a type of their own (not the field that takes the other keys)."""
    return {f.name: f for f in dataclasses.fields(node) if not f.metadata.get(OTHER_KEYS)}


def other_keys(node: Any) -> dict[str, Any] | None:
    """Where a section keeps keys outside its schema (ModelConfig.settings); None: it refuses them."""
    return next((getattr(node, f.name) for f in dataclasses.fields(node) if f.metadata.get(OTHER_KEYS)), None)


def apply_values(node: Any, values: dict, prefix: str, source: str) -> None:
    names, extra = schema_fields(node), other_keys(node)
    for key, value in values.items():
        full_key = f"{prefix}{key}"
        if key not in names and extra is not None:
            extra[str(key)] = untyped(value, full_key, source)
            continue
        if key not in names:
            raise ConfigError(f"{source}: unknown key {full_key!r}; known keys here: {', '.join(names)}")
        current = getattr(node, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {full_key!r} is a section; give it a mapping of keys")
            apply_values(current, value, prefix=f"{full_key}.", source=source)
        else:
            setattr(node, key, coerce(value, field_type(node, key), full_key, source))


def set_value(config: Any, dotted_key: str, text: str, source: str) -> None:
    *path, last = dotted_key.split(".")
    node: Any = config
    for depth, name in enumerate(path):
        if not dataclasses.is_dataclass(node) or not hasattr(node, name):
            raise ConfigError(f"{source}: unknown key {'.'.join(path[: depth + 1])!r}")
        node = getattr(node, name)
    if not dataclasses.is_dataclass(node):
        raise ConfigError(f"{source}: unknown key {dotted_key!r}")
    extra = other_keys(node)
    if last not in schema_fields(node) and extra is not None:
        extra[last] = untyped(parse_yaml_value(text, dotted_key, source), dotted_key, source)
        return
    if last not in schema_fields(node):
        raise ConfigError(f"{source}: unknown key {dotted_key!r}")
    if dataclasses.is_dataclass(getattr(node, last)):
        raise ConfigError(f"{source}: {dotted_key!r} is a section; set its keys one by one")
    expected = field_type(node, last)
    # A string option takes the text as typed, quotes and brackets included: `data.alphabet=0123`.
    value = text if expected is str else parse_yaml_value(text, dotted_key, source)
    setattr(node, last, coerce(value, expected, dotted_key, source))


def parse_yaml_value(text: str, key: str, source: str) -> Any:
    try:
        value = parse_yaml(text, source)
    except (yaml.YAMLError, ConfigError):
        raise ConfigError(f"{source}: cannot parse the value of {key!r}: {text!r}") from None
    return PlainText("") if value is None else value  # `key=`: an empty document


def field_type(node: Any, name: str) -> Any:
    return typing.get_type_hints(type(node))[name]


def read_plain(text: PlainText, key: str, source: str, may_be_text: bool = False) -> Any:
    """What an unquoted value means to a person: null, true/false, a decimal integer, a real number
    (`1e-3` included, which YAML 1.1 leaves as text), or text. A form that YAML 1.1, YAML 1.2 or
    Python read otherwise (`017`, `0x1F`, `1:30`, `1_000`, `on`) is refused with what to write.
    `may_be_text`: the key takes text as well (an architecture's own setting), so quoting is a way out."""
    if text in NULLS:
        return None
    if text in BOOLEANS:
        return BOOLEANS[text]
    if DECIMAL.fullmatch(text):
        return int(text)
    if REAL.fullmatch(text) and not re.fullmatch(r"[-+]?0[0-9]+([eE].*)?", text):
        return real(text)
    for pattern, why, write in AMBIGUOUS:
        if pattern.fullmatch(text):
            reading = yaml_1_1(text)
            written = write(text, reading)
            quote = ", or quote it for the text" if may_be_text and not written.startswith("'") else ""
            raise ConfigError(
                f"{source}: {key}={text} is ambiguous ({why}; PyYAML alone reads {reading!r}); write "
                f"{written}{quote}"
            )
    return str(text)


def yaml_1_1(text: str) -> Any:
    """What PyYAML alone makes of an unquoted value (shown when it differs from what a person reads)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def untyped(value: Any, key: str, source: str) -> Any:
    """A value for a key outside the schema (an architecture's own setting): each unquoted scalar as
    read_plain reads it, in lists and mappings too."""
    if isinstance(value, PlainText):
        return read_plain(value, key, source, may_be_text=True)
    if isinstance(value, list):
        return [untyped(item, f"{key}[{i}]", source) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {str(name): untyped(item, f"{key}.{name}", source) for name, item in value.items()}
    return value


def coerce(value: Any, expected: Any, key: str, source: str) -> Any:
    def wrong(what: str) -> ConfigError:
        return ConfigError(f"{source}: {key!r} must be {what}, got {typed!r}")

    typed = str(value) if isinstance(value, PlainText) else value  # as it was typed, for the messages

    if typing.get_origin(expected) in (types.UnionType, typing.Union):
        # `float | None`: null, or a value of the other type; `int | Literal["auto"]`: a word, or a value.
        options = typing.get_args(expected)
        if type(None) in options and (value is None or isinstance(value, PlainText) and value in (*NULLS, "~")):
            return None
        literals = [option for option in options if typing.get_origin(option) is Literal]
        words = [word for literal in literals for word in typing.get_args(literal)]
        if isinstance(value, str) and value in words:
            return str(value)  # plain text, not PlainText: the config is dumped to YAML as it is
        (inner,) = [option for option in options if option is not type(None) and option not in literals]
        try:
            return coerce(value, inner, key, source)
        except ConfigError:
            if not words:
                raise
            raise wrong(f"{'an integer' if inner is int else 'a number'} or {' or '.join(words)}") from None

    if typing.get_origin(expected) is list:
        (item_type,) = typing.get_args(expected)
        items = value if isinstance(value, list) else [value]  # a single value is a one-item list
        return [coerce(item, item_type, f"{key}[{i}]", source) for i, item in enumerate(items)]
    if expected is str:
        if isinstance(value, PlainText):  # a string key takes the text as typed
            if value == "~":
                raise ConfigError(
                    f"{source}: {key}=~ is ambiguous (null in YAML, the home folder in a shell); "
                    f"write '' for none, or the folder itself (~/ and a name)"
                )
            return "" if value in NULLS else str(value)
        if not isinstance(value, str):
            raise wrong("a string (quote it in YAML)")
        return value
    if isinstance(value, PlainText):
        value = read_plain(value, key, source)
    if expected is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if expected is int:
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            raise wrong(f"an integer (write {int(value)})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        return value
    if expected is float:
        # A quoted number ("1e-3") is accepted too, when it is one that read_plain would read.
        if isinstance(value, str) and REAL.fullmatch(value.strip()):
            return real(value.strip())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise wrong("a number")
    raise TypeError(f"unsupported config type for {key}: {expected}")
