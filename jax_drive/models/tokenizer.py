"""Tokenizer wrapper over the `tokenizers` library with a Jinja chat template.

Built either from an HF directory (tokenizer.json + tokenizer_config.json) or from the
metadata of a GGUF file (byte-level BPE, `tokenizer.ggml.model == 'gpt2'`). Neither path
imports torch or transformers.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import tokenizers


class TokenizerError(ValueError):
    """A tokenizer could not be built from the given files."""


def _token_content(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value.get("content")
    return str(value)


@functools.lru_cache(maxsize=16)
def _compiled_chat_template(template: str):
    """The jinja2 template object of ``template`` (compiling one takes ~4 ms: once per text)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent,
                                                                  ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def _render_chat_template(template: str, messages: Sequence[Mapping[str, Any]],
                          add_generation_prompt: bool, **extra) -> str:
    return _compiled_chat_template(template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt, **extra
    )


# ChatML fallback when a checkpoint ships no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class Tokenizer:
    """encode / decode / apply_chat_template with eos and pad ids.

    Attributes:
      eos_token_ids: ids that end a generation (tuple, non-empty when known).
      pad_token_id: id used for padding (falls back to the first eos id, then 0).
      bos_token_id: id of the beginning-of-sequence token or None.
      vocab_size: size of the tokenizer's vocabulary (may be < the model's embedding rows).
      chat_template: Jinja source or None.
    """

    def __init__(self, backend: tokenizers.Tokenizer, chat_template: str | None = None,
                 eos_token_ids: Sequence[int] = (), pad_token_id: int | None = None,
                 bos_token_id: int | None = None, add_bos: bool = False):
        self.backend = backend
        self.chat_template = chat_template
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        if pad_token_id is None:
            pad_token_id = self.eos_token_ids[0] if self.eos_token_ids else 0
        self.pad_token_id = int(pad_token_id)
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.add_bos = bool(add_bos)

    # ----------------------------------------------------------------- basics
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, idx: int) -> str | None:
        return self.backend.id_to_token(int(idx))

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` (special-token strings such as <|im_start|> are recognised).

        A BOS id is prepended only with add_special_tokens=True and a tokenizer that adds it.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return list(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True) -> str:
        """Renders `messages` ([{'role':..., 'content':...}, ...]) to the prompt string."""
        if not isinstance(messages, (list, tuple)) or not all(
            isinstance(m, Mapping) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        template = self.chat_template or CHATML_TEMPLATE
        return _render_chat_template(
            template, messages, add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "",
        )

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """From an HF directory holding tokenizer.json (+ tokenizer_config.json)."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerError(f"no tokenizer.json in {path}")
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").is_file():
            cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        elif template is None and (path / "chat_template.json").is_file():
            template = json.loads((path / "chat_template.json").read_text()).get("chat_template")

        def tid(value):
            content = _token_content(value)
            return None if content is None else backend.token_to_id(content)

        eos: list[int] = []
        first = tid(cfg.get("eos_token"))
        if first is not None:
            eos.append(first)
        gen_file = path / "generation_config.json"
        if gen_file.is_file():
            gen_eos = json.loads(gen_file.read_text()).get("eos_token_id")
            gen_eos = [gen_eos] if isinstance(gen_eos, int) else (gen_eos or [])
            eos += [int(i) for i in gen_eos if int(i) not in eos]
        cfg_file = path / "config.json"
        if not eos and cfg_file.is_file():
            model_eos = json.loads(cfg_file.read_text()).get("eos_token_id")
            model_eos = [model_eos] if isinstance(model_eos, int) else (model_eos or [])
            eos += [int(i) for i in model_eos]
        return cls(backend, template, eos, tid(cfg.get("pad_token")), tid(cfg.get("bos_token")),
                   add_bos=bool(cfg.get("add_bos_token", False)))

    @classmethod
    def from_gguf(cls, source) -> "Tokenizer":
        """From a GGUF file path (or an open gguf.GGUFReader); byte-level BPE only."""
        import gguf

        reader = source if isinstance(source, gguf.GGUFReader) else gguf.GGUFReader(str(source))
        fields = reader.fields

        def get(name, default=None):
            field = fields.get(name)
            return default if field is None else field.contents()

        model = get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError("GGUF file has no tokenizer metadata")
        if model != "gpt2":
            raise TokenizerError(
                f"unsupported GGUF tokenizer model {model!r}: only byte-level BPE ('gpt2') "
                "is supported; convert the checkpoint to an HF directory instead"
            )
        tokens = list(get("tokenizer.ggml.tokens"))
        types = list(get("tokenizer.ggml.token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", [])]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        bpe = tokenizers.models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                    byte_fallback=False)
        backend = tokenizers.Tokenizer(bpe)
        backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
            add_prefix_space=bool(get("tokenizer.ggml.add_space_prefix", False)), use_regex=True
        )
        backend.decoder = tokenizers.decoders.ByteLevel()
        specials = [
            tokenizers.AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t in (3, 4)  # CONTROL, USER_DEFINED
        ]
        backend.add_special_tokens(specials)
        eos = get("tokenizer.ggml.eos_token_id")
        eot = get("tokenizer.ggml.eot_token_id")
        eos_ids = [int(i) for i in (eos, eot) if i is not None]
        eos_ids = list(dict.fromkeys(eos_ids))
        return cls(
            backend,
            get("tokenizer.chat_template"),
            eos_ids,
            get("tokenizer.ggml.padding_token_id"),
            get("tokenizer.ggml.bos_token_id"),
            add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
        )

    def save(self, out_dir: str | Path) -> None:
        """Writes tokenizer.json, tokenizer_config.json (+ chat template) to out_dir."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(out / "tokenizer.json"))
        cfg: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            "clean_up_tokenization_spaces": False,
        }
        if self.eos_token is not None:
            cfg["eos_token"] = self.eos_token
        if self.bos_token is not None:
            cfg["bos_token"] = self.bos_token
        cfg["pad_token"] = self.id_to_token(self.pad_token_id)
        if self.chat_template:
            cfg["chat_template"] = self.chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
        (out / "generation_config.json").write_text(
            json.dumps({"eos_token_id": list(self.eos_token_ids),
                        "pad_token_id": self.pad_token_id}, indent=2)
        )
