"""The shapes of the pairs this project knows: a target (LFM2 layout, dense or MoE) and a DSpark
drafter, small (tests), medium (CPU sweeps) and full-size (the published ones). Plain facts, no
numpy: ``check`` and ``families`` read them without the generator (``ggufdspark.synthetic``),
which builds checkpoints of these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TargetSpec:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 6
    attention_layers: tuple[int, ...] = (2, 4)
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    conv_L_cache: int = 3
    max_position_embeddings: int = 128000
    rope_theta: float = 1000000.0
    norm_eps: float = 1e-5
    # LFM2's ``block_auto_adjust_ff_dim``: the config then says ``block_ff_dim`` = 3/2 of the width the
    # weights have (LFM2-1.2B: 12288 in the config, 8192 in the weights); intermediate_size must be a
    # multiple of 256 (``block_multiple_of``) for the round trip to give it back
    ff_auto_adjust: bool = False
    # LFM2-MoE (``Lfm2MoeForCausalLM``) when num_experts > 0: the first num_dense_layers layers keep the
    # dense FFN (intermediate_size wide), the others route to num_experts experts of width
    # moe_intermediate_size, num_experts_per_tok active, with a sigmoid router and an expert bias
    num_experts: int = 0
    num_experts_per_tok: int = 0
    num_dense_layers: int = 0
    moe_intermediate_size: int = 0
    # the conv layers' weights: kernel std, and projection std times sqrt(hidden). (0.3, 0.5) leaves them
    # a few percent of the residual (every pair generated so far); (1.0, 1.0) makes them strong enough
    # that a wrong conv state changes the output (tests/test_parallel_spec.py's strong-conv pair)
    conv_std: tuple[float, float] = (0.3, 0.5)

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    def layer_types(self) -> list[str]:
        return ["full_attention" if i in self.attention_layers else "conv" for i in range(self.num_hidden_layers)]


@dataclass
class DrafterSpec:
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    target_layer_ids: tuple[int, ...] = (1, 3, 4)
    block_size: int = 6
    markov_rank: int = 16
    confidence_head: bool = True
    rope_is_neox_style: bool = False
    markov_head_type: str = "vanilla"
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    repeat_bias: bool = True  # Markov head favours repeating the previous token
    # The defaults make a drafter whose drafts do not depend on its hidden state (every pair generated
    # so far): the Markov head picks the tokens, the confidence head says about 0.98 everywhere (whole
    # blocks at any --spec-draft-p-min below that), and q_norm/k_norm near 1 give attention scores
    # about N(0, 1), spread over the whole context, so the target features injected there reach the
    # hidden state averaged down to a few percent of it. Wrong features then change nothing a client
    # sees. Confidence bias 0 and std 0.1 centre the confidence on 0.5 and spread it (logits about
    # N(0, 1)): a threshold of 0.5 cuts some drafts and not others. A q/k norm gain of 2.5 makes the
    # scores pick a few context positions, whose features then move the hidden state and with it the
    # confidence (tests/conftest.py's hidden_conf_pair). Measured on 24 requests served one at a time
    # with the features zeroed (a developer build's LLAMA_SPEC_TAP=noset), the drafted/accepted counts
    # changed for none with the defaults, 10 with the centred confidence alone, 24 with both.
    confidence_bias: float = 4.0  # the confidence head's bias (a logit)
    confidence_std: float = 0.01  # the spread of its weights, over [hidden; markov_w1[prev]]
    qk_norm_gain: float = 1.0  # scales every layer's q_norm and k_norm weights (around 1 each)


SMALL_TARGET = TargetSpec()
SMALL_DRAFTER = DrafterSpec()
# A pair between the small test pair and the published shapes, for CPU sweeps that finish in
# minutes: about 320M target parameters (LFM2 layout, 16 layers, 5 of them attention) and a 62M
# drafter of the published layout (4 layers, block 9), the same draft/target size order.
MEDIUM_TARGET = TargetSpec(vocab_size=32000, hidden_size=1024, intermediate_size=4608, num_hidden_layers=16,
                                 attention_layers=(2, 5, 8, 11, 14), num_attention_heads=16, num_key_value_heads=4)
MEDIUM_DRAFTER = DrafterSpec(num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                   intermediate_size=3072, target_layer_ids=(2, 6, 9, 12, 14), block_size=9,
                                   markov_rank=128, repeat_bias=False)
# The published shapes (../shared/DESIGN.md): LFM2.5-VL-3B's tower and its 279.5M drafter.
FULL_TARGET = TargetSpec(vocab_size=128000, hidden_size=2048, intermediate_size=9216, num_hidden_layers=30,
                         attention_layers=(2, 5, 8, 11, 14, 17, 20, 23, 26, 29), num_attention_heads=32,
                         num_key_value_heads=8)
FULL_DRAFTER = DrafterSpec(num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                           intermediate_size=6144, target_layer_ids=(2, 9, 17, 21, 27), block_size=9,
                           markov_rank=256, repeat_bias=False)
