"""Many Hugging Face model families run unmodified under strict carbon.enable:
tiny configs (no downloads), one AdamW training step, the same bits at 1 and 2
CPU threads. Between them they use convolutions (1-d, 2-d, transposed-free
stems, depthwise), batch / group / layer norm, pooling, bilinear upsampling,
weight normalization, grouped and multi-query attention, learned attention
biases (T5), ALiBi (BLOOM), rotary embeddings, advanced-index gradients and
binary cross-entropy, a CTC head (wav2vec2), Mamba's selective scan (expm1, softplus, cumulative
sums), Mixtral's experts (top-k routing, grouped products), FNet's Fourier token mixing (fftn) and Autoformer's
FFT autocorrelation and series decomposition. transformers is a test-only dependency."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import carbon
from tests.oracle import as_bits

T = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _ids():
    return torch.randint(3, 100, (2, 8))


def _pixels(size=32):
    return torch.randn(2, 3, size, size)


def _labels():
    return torch.randint(0, 2, (2,))


# name -> (build the model, its loss on fresh inputs); every input is drawn under enable (carbon's generator)
MODELS = {
    "bert": (lambda: T.BertForSequenceClassification(T.BertConfig(vocab_size=100, **SMALL)),
             lambda m: m(input_ids=_ids(), labels=_labels()).loss),
    "vit": (lambda: T.ViTForImageClassification(T.ViTConfig(image_size=32, patch_size=8, **SMALL)),
            lambda m: m(pixel_values=_pixels(), labels=_labels()).loss),
    "t5": (lambda: T.T5ForConditionalGeneration(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                           num_heads=4, decoder_start_token_id=0)),
           lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "whisper": (lambda: T.WhisperForConditionalGeneration(T.WhisperConfig(
        vocab_size=100, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
        lambda m: m(input_features=torch.randn(2, 8, 32), labels=_ids()).loss),
    "mistral": (lambda: T.MistralForCausalLM(T.MistralConfig(vocab_size=100, num_key_value_heads=2, **SMALL)),
                lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "mixtral": (lambda: T.MixtralForCausalLM(T.MixtralConfig(vocab_size=100, num_key_value_heads=2, num_local_experts=4,
                                                            num_experts_per_tok=2, **SMALL)),
                lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "falcon": (lambda: T.FalconForCausalLM(T.FalconConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                          num_attention_heads=4)),
               lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4)),
              lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "swin": (lambda: T.SwinForImageClassification(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                               num_heads=[2, 2], window_size=4, num_labels=3)),
             lambda m: m(pixel_values=_pixels(), labels=_labels()).loss),
    "wav2vec2": (lambda: T.Wav2Vec2ForSequenceClassification(T.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, num_labels=2)),
        lambda m: m(input_values=torch.randn(2, 400), labels=_labels()).loss),
    "wav2vec2_ctc": (lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(
        vocab_size=12, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, pad_token_id=0, ctc_loss_reduction="mean")),
        lambda m: m(input_values=torch.randn(2, 400), labels=torch.tensor([[3, 4, 4, 5], [6, 7, -100, -100]])).loss),
    "clip": (lambda: T.CLIPModel(T.CLIPConfig(text_config=dict(vocab_size=100, **SMALL),
                                              vision_config=dict(image_size=32, patch_size=8, **SMALL),
                                              projection_dim=16)),
             lambda m: m(input_ids=_ids(), pixel_values=_pixels(), return_loss=True).loss),
    "segformer": (lambda: T.SegformerForSemanticSegmentation(T.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2],
        decoder_hidden_size=16, num_labels=3, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
        lambda m: m(pixel_values=_pixels(), labels=torch.randint(0, 3, (2, 32, 32))).loss),
    "electra": (lambda: T.ElectraForPreTraining(T.ElectraConfig(vocab_size=100, embedding_size=16, **SMALL)),
                lambda m: m(input_ids=_ids(), labels=torch.randint(0, 2, (2, 8))).loss),
    "convnext": (lambda: T.ConvNextForImageClassification(T.ConvNextConfig(num_stages=2, hidden_sizes=[8, 16],
                                                                           depths=[1, 1], num_labels=3)),
                 lambda m: m(pixel_values=_pixels(), labels=_labels()).loss),
    "resnet": (lambda: T.ResNetForImageClassification(T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16],
                                                                     depths=[1, 1], num_labels=3)),
               lambda m: m(pixel_values=_pixels(), labels=_labels()).loss),
    "mamba": (lambda: T.MambaForCausalLM(T.MambaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=4)),
              lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "mobilenet_v2": (lambda: T.MobileNetV2ForImageClassification(T.MobileNetV2Config(image_size=32, depth_multiplier=0.25,
                                                                                     num_labels=3)),
                     lambda m: m(pixel_values=_pixels(), labels=_labels()).loss),
    "fnet": (lambda: T.FNetForMaskedLM(T.FNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                    intermediate_size=64, max_position_embeddings=16,
                                                    use_tpu_fourier_optimizations=False)),
             lambda m: m(input_ids=_ids(), labels=_ids()).loss),
    "autoformer": (lambda: T.AutoformerForPrediction(T.AutoformerConfig(
        prediction_length=8, context_length=16, lags_sequence=[1, 2, 3], d_model=16, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        num_time_features=1)),
        lambda m: m(past_values=torch.randn(2, 19), past_time_features=torch.randn(2, 19, 1),
                    past_observed_mask=torch.ones(2, 19), future_values=torch.randn(2, 8),
                    future_time_features=torch.randn(2, 8, 1)).loss),
}


def _train(name: str, threads: int):
    build, loss_of = MODELS[name]
    torch.set_num_threads(threads)
    np.random.seed(0)  # wav2vec2's SpecAugment masks come from numpy's generator, which carbon does not own
    with carbon.enabled(seed=0):
        model = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = loss_of(model)
        loss.backward()
        opt.step()
    return as_bits(loss.detach()), {k: as_bits(v) for k, v in model.state_dict().items() if v.is_floating_point()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_training_step_gives_the_same_bits_at_one_and_two_threads(name, restore_num_threads):
    try:
        loss1, one = _train(name, 1)
    except AttributeError as e:  # a model family this transformers version does not have
        if "transformers" not in str(e):
            raise
        pytest.skip(f"transformers {T.__version__}: {e}")
    loss2, two = _train(name, 2)
    assert torch.equal(loss1, loss2), "loss"
    assert one.keys() == two.keys()
    for key in one:
        assert torch.equal(one[key], two[key]), key
