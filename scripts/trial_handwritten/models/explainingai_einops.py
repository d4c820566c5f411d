"""ExplainingAI, "Vision Transformer in PyTorch" (YouTube + repo): a colour-MNIST ViT written with einops.

Source: github.com/explainingai-code/VIT-Pytorch  model/attention.py @ 47a75f7806e7b7e403274c48410e7cbd67eed1a8,
        model/patch_embed.py @ 47a75f78..., model/transformer_layer.py, model/transformer.py @ fd851480b7dd2a71fe869728111f11c752a5ea33
Style: a config dict, einops rearrange for patches ('b c (nh ph) (nw pw) -> b (nh nw) (ph pw c)') and heads, fused
qkv_proj WITHOUT bias split with .split(att_dim), an explicit head_dim (att_dim = n_heads * head_dim can differ
from emb_dim), a class token stored as a 1-D (D,) vector, output_proj inside an nn.Sequential, final norm, fc_number.
Verbatim (the long comments shortened); the four files merged into one. make_model(): the repo's
config/default.yaml (224 px, patch 16, emb 128, 8 heads of head_dim 64: q/k/v 4x wider than emb) -> 3 x 32 x 32,
patch 4, emb 64, 4 heads of 32 (q/k/v 2x wider than emb).
"""
import torch
import torch.nn as nn
from einops import rearrange, repeat


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config['n_heads']
        self.head_dim = config['head_dim']
        self.emb_dim = config['emb_dim']
        self.drop_prob = config['dropout'] if 'dropout' in config else 0.0
        self.att_dim = self.n_heads * self.head_dim

        self.qkv_proj = nn.Linear(self.emb_dim, 3 * self.att_dim, bias=False)
        self.output_proj = nn.Sequential(
            nn.Linear(self.att_dim, self.emb_dim),
            nn.Dropout(self.drop_prob))

        self.attn_dropout = nn.Dropout(self.drop_prob)

    def forward(self, x):
        # Batch Size x Number of Patches x Dimension
        B, N = x.shape[:2]
        # q(as well as k and v) -> Batch Size x Number of Patches x Attention Dimension
        q, k ,v = self.qkv_proj(x).split(self.att_dim, dim=-1)
        q = rearrange(q, 'b n (n_h h_dim) -> b n_h n h_dim',
                      n_h=self.n_heads, h_dim=self.head_dim)
        k = rearrange(k, 'b n (n_h h_dim) -> b n_h n h_dim',
                      n_h=self.n_heads, h_dim=self.head_dim)
        v = rearrange(v, 'b n (n_h h_dim) -> b n_h n h_dim',
                      n_h=self.n_heads, h_dim=self.head_dim)

        # B x H x N x Head Dimension @ B x H x Head Dimension x N -> B x H x N x N
        att = torch.matmul(q, k.transpose(-2, -1)) * (self.head_dim**(-0.5))
        att = torch.nn.functional.softmax(att, dim=-1)
        att = self.attn_dropout(att)

        #  B x H x N x N @ B x H x N x Head Dimension -> B x H x N x Head Dimension
        out = torch.matmul(att, v)

        # B x N x (Heads * Head Dimension) -> B x N x (Attention Dimension)
        out = rearrange(out, 'b n_h n h_dim -> b n (n_h h_dim)')
        #  B x N x Dimension
        out = self.output_proj(out)

        return out


class PatchEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        image_height = config['image_height']
        image_width = config['image_width']
        im_channels = config['im_channels']
        emb_dim = config['emb_dim']
        patch_embd_drop = config['patch_emb_drop']

        self.patch_height = config['patch_height']
        self.patch_width = config['patch_width']

        num_patches = (image_height // self.patch_height) * (image_width // self.patch_width)

        patch_dim = im_channels * self.patch_height * self.patch_width

        self.patch_embed = nn.Sequential(
            nn.Linear(patch_dim, emb_dim),
        )

        # Positional information needs to be added to cls as well so 1+num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, emb_dim))
        self.cls_token = nn.Parameter(torch.randn(emb_dim))
        self.patch_emb_dropout = nn.Dropout(patch_embd_drop)

    def forward(self, x):
        batch_size = x.shape[0]

        out = rearrange(x, 'b c (nh ph) (nw pw) -> b (nh nw) (ph pw c)',
                      ph=self.patch_height,
                      pw=self.patch_width)
        out = self.patch_embed(out)

        # Add cls
        cls_tokens = repeat(self.cls_token, 'd -> b 1 d', b=batch_size)
        out = torch.cat((cls_tokens, out), dim=1)

        # Add position embedding and do dropout
        out += self.pos_embed
        out = self.patch_emb_dropout(out)

        return out


class TransformerLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        emb_dim = config['emb_dim']
        ff_hidden_dim = config['ff_dim'] if 'ff_dim' in config else 4*emb_dim
        ff_drop_prob = config['ff_drop'] if 'ff_drop' in config else 0.0
        self.att_norm = nn.LayerNorm(emb_dim)
        self.attn_block = Attention(config)
        self.ff_norm = nn.LayerNorm(emb_dim)

        self.ff_block = nn.Sequential(
            nn.Linear(emb_dim, ff_hidden_dim),
            nn.GELU(),
            nn.Dropout(ff_drop_prob),
            nn.Linear(ff_hidden_dim, emb_dim),
            nn.Dropout(ff_drop_prob)
        )

    def forward(self, x):
        out = x
        out = out + self.attn_block(self.att_norm(out))
        out = out + self.ff_block(self.ff_norm(out))
        return out


class VIT(nn.Module):
    def __init__(self, config):
        super().__init__()
        n_layers = config['n_layers']
        emb_dim = config['emb_dim']
        num_classes = config['num_classes']
        self.patch_embed_layer = PatchEmbedding(config)
        self.layers = nn.ModuleList([
            TransformerLayer(config) for _ in range(n_layers)
        ])
        self.norm = nn.LayerNorm(emb_dim)
        self.fc_number = nn.Linear(emb_dim, num_classes)

    def forward(self, x):
        # Patchify and add CLS token
        out = self.patch_embed_layer(x)

        # Go through the transformer layers
        for layer in self.layers:
            out = layer(out)
        out = self.norm(out)

        # Compute logits
        return self.fc_number(out[:, 0])


# config/default.yaml's model_params, smaller
model_config = {
    'image_height': 32, 'image_width': 32, 'im_channels': 3,
    'patch_height': 4, 'patch_width': 4,
    'emb_dim': 64, 'n_heads': 4, 'head_dim': 32, 'n_layers': 3,   # repo: emb 128, 8 heads x 64 (att_dim 4x emb)
    'ff_dim': 128, 'ff_drop': 0.0, 'patch_emb_drop': 0.0, 'dropout': 0.0,
    'num_classes': 10,
}


def make_model():
    return VIT(model_config)
