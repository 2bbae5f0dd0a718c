"""Every default of every config field, in one place. Experiment files start from here."""

import dataclasses

from ml_collections import ConfigDict

from loopscale.config.schema import InitConfig


def base_config() -> ConfigDict:
    c = ConfigDict()
    c.name = "base"
    c.seed = 0
    # What a training FLOP counts when budgets are spent (flops.FlopConvention).
    c.flop_convention = "6n_emb"

    c.model = ConfigDict(
        dict(
            vocab_size=256,
            vocab_multiple=1,
            d_model=128,
            n_heads=2,
            head_dim=0,
            n_unique=2,
            n_loops=1,
            n_prelude=0,
            n_coda=0,
            injection="none",
            loop_modulation="none",
            embed_norm=False,
            attention="auto",
            ffn="dense",
            mlp="swiglu",
            d_ff=0,
            n_experts=8,
            top_k=2,
            expert_d_ff=0,
            moe_dispatch="dropless",
            moe_matmul="auto",
            capacity_factor=1.25,
            qk_norm=False,
            norm_gain=False,
            norm_eps=1e-6,
            rope_base=10000.0,
            logit_softcap=0.0,
            zero_init_out=False,
            zero_init_readout=False,
            loss_loops="last",
            param="mup",
            base_d_model=128,
            init_std=0.02,
            # Per kind of weight (schema.InitConfig); std 0: init_std. model/layers.py draws them.
            init={f.name: dict(dist="normal", std=0.0) for f in dataclasses.fields(InitConfig)},
            attn_mult=1.0,
            output_mult=1.0,
            emb_mult=1.0,
            remat="none",
            scan=True,
            scan_loops=True,
            dtype="float32",
            count_router=True,
        )
    )

    c.train = ConfigDict(
        dict(
            steps=200,
            batch_size=16,
            seq_len=128,
            lr=3e-3,
            schedule="cosine",
            warmup_steps=10,
            decay_frac=0.2,
            cooldown="linear",
            min_lr_frac=0.0,
            optimizer="adamw",
            b1=0.9,
            b2=0.95,
            eps=1e-8,
            weight_decay=0.0,
            weight_decay_mode="coupled",
            grad_clip=1.0,
            grad_accum=1,
            embed_lr=0.0,
            head_lr=0.0,
            muon_momentum=0.95,
            muon_momentum_start=0.95,
            muon_momentum_warmup=0,
            z_loss_weight=0.0,
            ce_chunk=512,
            lb_loss_weight=0.01,
            router_z_weight=0.001,
            loop_dist="fixed",
            loop_choices=(),
            loop_mean=4.0,
            loop_sigma=0.5,
            loop_max=0,
            bptt_loops=0,
            grad_reduction="once",
            intermediate_supervision=False,
            log_every=1,
            eval_every=50,
            eval_batches=4,
            checkpoint_every=50,
            keep_checkpoints=2,
            keep_steps=(),
            branch_from="",
            branch_step=0,
            loop_grad_every=0,
            log_act_grads=False,
            log_grad_cosine=False,
            peak_flops=0.0,
        )
    )

    c.data = ConfigDict(
        dict(
            source="text",
            paths="",
            tokenizer="byte",
            spm_vocab_size=1024,
            val_fraction=0.01,
            val_split="tail",
            cache_dir="",
            n_nodes=16,
            hops_min=4,
            hops_max=4,
            tfds_name="",
            tfds_data_dir="",
            tfds_text_key="text",
            worker_count=0,
        )
    )

    c.mesh = ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1, zero1=False))
    return c
