"""omihub777, "ViT-CIFAR" (a popular CIFAR-10 ViT from scratch).

Source: github.com/omihub777/ViT-CIFAR  vit.py @ 89493e0f23d59b206edd50e5c238709d69295e79,
        layers.py @ 3ef5f64f3b2fb38c4dc139ec45feee0b4fbafe8f
Style: patches cut with Tensor.unfold and permuted to (p1 p2 c) order, Linear embedding, separate q/k/v Linears,
einsum attention with NO 1/sqrt(d) scaling, an MLP of Linear-GELU-Linear-GELU (square, feats -> feats), head
LayerNorm + Linear on the class token (no separate final norm). `import torchsummary` dropped (not installed).
Changed for size only: ViTSmall hard-codes hidden=384 and seven encoders; here hidden=64 and two (marked).
make_model(): 3 x 32 x 32, patch=4 patches per side (8 px).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------- layers.py
class TransformerEncoder(nn.Module):
    def __init__(self, feats:int, head:int=8):
        super(TransformerEncoder, self).__init__()
        self.la1 = nn.LayerNorm(feats)
        self.msa = MultiHeadSelfAttention(feats, head=head)
        self.la2 = nn.LayerNorm(feats)
        self.mlp = nn.Sequential(
            nn.Linear(feats, feats),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(feats, feats),
            nn.GELU(),
            nn.Dropout(0.1),
        )

    def forward(self, x):
        out = self.msa(self.la1(x)) + x
        out = self.mlp(self.la2(out)) + out
        return out


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, feats:int, head:int=8):
        super(MultiHeadSelfAttention, self).__init__()
        self.head = head
        self.feats = feats

        self.q = nn.Linear(feats, feats)
        self.k = nn.Linear(feats, feats)
        self.v = nn.Linear(feats, feats)

        self.o = nn.Linear(feats, feats)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        b, n, f = x.size()
        q = self.q(x).view(b, n, self.head, self.feats//self.head).transpose(1,2)
        k = self.k(x).view(b, n, self.head, self.feats//self.head).transpose(1,2)
        v = self.v(x).view(b, n, self.head, self.feats//self.head).transpose(1,2)

        score = F.softmax(torch.einsum("bhif, bhjf->bhij", q, k), dim=-1) #(b,h,n,n)
        attn = torch.einsum("bhij, bhjf->bihf", score, v) #(b,n,h,f//h)
        o = self.dropout(self.o(attn.flatten(2)))
        return o


# ---------------------------------------------------------------- vit.py
class ViTSmall(nn.Module):
    def __init__(self, in_c:int=3, num_classes:int=10, img_size:int=32, patch:int=8):
        super(ViTSmall, self).__init__()
        hidden=64  # trial: 384 in the repo

        self.patch = patch # number of patches in one row(or col)
        self.patch_size = img_size//self.patch
        f = (img_size//self.patch)**2*3 # 48 # patch vec length

        self.emb = nn.Linear(f, hidden) # (b, n, f)
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden))
        self.pos_emb = nn.Parameter(torch.randn(1, (self.patch**2)+1, hidden))
        self.enc = nn.Sequential(
            TransformerEncoder(hidden),
            TransformerEncoder(hidden),  # trial: seven in the repo
        )
        self.fc = nn.Sequential(
            nn.LayerNorm(hidden),
            nn.Linear(hidden, num_classes) # for cls_token
        )


    def forward(self, x):
        out = self._to_words(x)
        out = torch.cat([self.cls_token.repeat(out.size(0),1,1), self.emb(out)],dim=1)
        out = out + self.pos_emb
        out = self.enc(out)
        out = out[:,0]
        out = self.fc(out)
        return out

    def _to_words(self, x):
        """
        (b, c, h, w) -> (b, n, f)
        """
        out = x.unfold(2, self.patch_size, self.patch_size).unfold(3, self.patch_size, self.patch_size).permute(0,2,3,4,5,1).contiguous()
        out = out.view(x.size(0), self.patch**2 ,-1)
        return out


def make_model():
    return ViTSmall(3, 10, 32, 4)
