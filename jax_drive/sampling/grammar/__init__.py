"""Structured generation: grammars compiled to token automata that the sampler, the trainer
and remote servers share (see docs/structured.md).

Public API:
  Grammar, GrammarError, RegexError     what an answer must look like (regex / JSON schema /
                                        choice / anything) and the one error type
  token_vocabulary, TokenVocabulary     each token id's bytes from our own tokenizer objects
  compile_grammar, GrammarCompiler,     grammar -> token automaton (outlines-core), refused
    CompiledGrammar, check_budget,        when it has a dead end, too many states or cannot
    anything_grammar                      finish within a budget; the compiler caches
  stack_grammars, GrammarTables, bucket  padded, stacked device tables (one grammar per row)
  allowed_tokens, allowed_classes,      the mask (the one home: sampler and trainer), the
    mask_logits, advance, token_allowed,  automaton step, legality of one token, acceptance,
    is_accepting, forced_token,           jump-forward helpers and the trainer's replay
    forced_run, replay_states
  to_gbnf, request_fields,              the same grammar for llama.cpp / vLLM / OpenAI servers
    vllm_structured_outputs, openai_response_format
  trajectory_grammar, action_grammar,   the project's answer formats
    memory_grammar, prose_grammar,
    actor_reply_grammar, sum_actions_grammar, consensus_grammar
"""

from jax_drive.sampling.grammar.compile import (
    CompiledGrammar,
    GrammarCompiler,
    anything_grammar,
    check_budget,
    compile_grammar,
)
from jax_drive.sampling.grammar.dialects import (
    openai_response_format,
    request_fields,
    to_gbnf,
    vllm_structured_outputs,
)
from jax_drive.sampling.grammar.formats import (
    action_grammar,
    actor_reply_grammar,
    consensus_grammar,
    memory_grammar,
    prose_grammar,
    sum_actions_grammar,
    trajectory_grammar,
)
from jax_drive.sampling.grammar.regex import GrammarError, RegexError
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sampling.grammar.tables import (
    GrammarTables,
    advance,
    allowed_classes,
    allowed_tokens,
    bucket,
    forced_run,
    forced_token,
    is_accepting,
    mask_logits,
    replay_states,
    stack_grammars,
    token_allowed,
)
from jax_drive.sampling.grammar.vocab import TokenVocabulary, token_vocabulary

__all__ = [
    "CompiledGrammar",
    "Grammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarTables",
    "RegexError",
    "TokenVocabulary",
    "action_grammar",
    "actor_reply_grammar",
    "advance",
    "allowed_classes",
    "allowed_tokens",
    "anything_grammar",
    "bucket",
    "check_budget",
    "compile_grammar",
    "consensus_grammar",
    "forced_run",
    "forced_token",
    "is_accepting",
    "mask_logits",
    "memory_grammar",
    "openai_response_format",
    "prose_grammar",
    "replay_states",
    "request_fields",
    "stack_grammars",
    "sum_actions_grammar",
    "to_gbnf",
    "token_allowed",
    "token_vocabulary",
    "trajectory_grammar",
    "vllm_structured_outputs",
]
