"""A real client: Hugging Face transformers' GPT2LMHeadModel (a small config,
no downloads) under carbon.enable — training steps give the same bits at 1 and
2 CPU threads, and a sequence's logits do not depend on the batch it is in.
transformers is a test-only dependency (requirements-dev.txt)."""

from __future__ import annotations

import pytest
import torch

import carbon
from tests.oracle import as_bits

transformers = pytest.importorskip("transformers")


def _config():
    return transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                   bos_token_id=0, eos_token_id=0)


def _trained(threads: int, steps: int = 2, device: str = "cpu"):
    """GPT-2 built (on the CPU) and trained under carbon.enabled(seed=0) on ``device``, with its dropout (the
    model is in training mode); the data are drawn on the CPU. Returns (model, optimizer)."""
    torch.set_num_threads(threads)
    with carbon.enabled(seed=0):
        model = transformers.GPT2LMHeadModel(_config()).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(steps):
            ids = torch.randint(0, 97, (4, 32)).to(device)
            model(input_ids=ids, labels=ids).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    return model, opt


def _train(threads: int, steps: int = 2):
    model, _ = _trained(threads, steps)
    return {k: as_bits(v) for k, v in model.state_dict().items() if v.is_floating_point()}


def test_gpt2_trains_to_the_same_bits_at_one_and_two_threads(restore_num_threads):
    one, two = _train(1), _train(2)
    assert one.keys() == two.keys()
    for name in one:
        assert torch.equal(one[name], two[name]), name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt2_training_on_cuda_has_the_cpus_fingerprint(restore_num_threads):
    """The CPU test's training run (same seed, same steps), on the GPU: the model's and AdamW's states have the
    CPU's bits."""
    cpu_model, cpu_opt = _trained(2, device="cpu")
    gpu_model, gpu_opt = _trained(2, device="cuda")
    assert next(gpu_model.parameters()).device.type == "cuda"
    cpu, gpu = carbon.fingerprint(cpu_model, cpu_opt), carbon.fingerprint(gpu_model, gpu_opt)
    assert any(name.startswith("optimizer.state.") for name in cpu.tensors)  # AdamW's states are in it
    assert gpu == cpu, gpu.diff(cpu)


def test_gpt2_logits_do_not_depend_on_the_batch():
    with carbon.enabled(seed=1):
        model = transformers.GPT2LMHeadModel(_config()).eval()
    ids = torch.randint(0, 97, (8, 32), generator=torch.Generator().manual_seed(0))
    with carbon.enabled(), torch.no_grad():
        batch = model(input_ids=ids).logits
        alone = model(input_ids=ids[5:6]).logits
    assert torch.equal(as_bits(batch[5:6]), as_bits(alone))


# ---- Llama: rotary embeddings (sin, cos, pow), RMSNorm, SiLU ---------------------------------------------------

def _llama_config():
    return transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                    bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _train_llama(threads: int, steps: int = 2):
    torch.set_num_threads(threads)
    with carbon.enabled(seed=0):  # strict: every op of the model is covered
        model = transformers.LlamaForCausalLM(_llama_config())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(steps):
            ids = torch.randint(0, 97, (4, 24))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    return {k: as_bits(v) for k, v in model.state_dict().items() if v.is_floating_point()}


def test_llama_trains_to_the_same_bits_at_one_and_two_threads(restore_num_threads):
    one, two = _train_llama(1), _train_llama(2)
    assert one.keys() == two.keys()
    for name in one:
        assert torch.equal(one[name], two[name]), name


def test_llama_logits_do_not_depend_on_the_batch():
    with carbon.enabled(seed=1):
        model = transformers.LlamaForCausalLM(_llama_config()).eval()
    ids = torch.randint(0, 97, (6, 24), generator=torch.Generator().manual_seed(0))
    with carbon.enabled(), torch.no_grad():
        batch = model(input_ids=ids).logits
        alone = model(input_ids=ids[4:5]).logits
    assert torch.equal(as_bits(batch[4:5]), as_bits(alone))


# ---- generation with sampling (RL rollouts): softmax, top-k, top-p (cumsum), multinomial ----------------------

def _generate(device: str = "cpu"):
    with carbon.enabled(seed=0):
        model = transformers.GPT2LMHeadModel(_config()).eval().to(device)
        ids = torch.randint(1, 97, (3, 5)).to(device)
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=20, top_p=0.9,
                              temperature=0.8, max_new_tokens=10, pad_token_id=0).cpu()


def test_gpt2_sampling_runs_under_strict_enable_and_is_thread_invariant(restore_num_threads):
    torch.set_num_threads(1)
    one = _generate()
    torch.set_num_threads(2)
    assert torch.equal(one, _generate())
    assert one.shape == (3, 15)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpt2_sampling_on_cuda_equals_the_cpu():
    assert torch.equal(_generate("cuda"), _generate("cpu"))
