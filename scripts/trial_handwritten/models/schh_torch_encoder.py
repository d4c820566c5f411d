"""s-chh's second model in the same file: the ViT on nn.TransformerEncoder (PyTorch's own layers).

Source: github.com/s-chh/PyTorch-Scratch-Vision-Transformer-ViT  model.py @ 026c5bed8d6dc088b24066510dddc01bde0b163d
        (class VisionTransformer_pytorch, with the file's EmbedLayer / Classifier / vit_init_weights)
Style: nn.TransformerEncoderLayer(batch_first=True, norm_first=True, activation=nn.GELU() -- a module instance, not
the string), the final LayerNorm passed as nn.TransformerEncoder(norm=...), positions on the patches only, tanh
Classifier head. make_model(): 3 x 32 x 32, patch 4.
"""
import torch
import torch.nn as nn


class EmbedLayer(nn.Module):
    def __init__(self, n_channels, embed_dim, image_size, patch_size, dropout=0.0):
        super().__init__()
        self.conv1         = nn.Conv2d(n_channels, embed_dim, kernel_size=patch_size, stride=patch_size)                       # Patch Encoding
        self.pos_embedding = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2, embed_dim), requires_grad=True)      # Learnable Positional Embedding
        self.cls_token     = nn.Parameter(torch.zeros(1, 1, embed_dim), requires_grad=True)                                    # Classification Token
        self.dropout       = nn.Dropout(dropout)

    def forward(self, x):
        B = x.shape[0]
        x = self.conv1(x)
        x = x.reshape([B, x.shape[1], -1])
        x = x.permute(0, 2, 1)
        x = x + self.pos_embedding
        x = torch.cat((torch.repeat_interleave(self.cls_token, B, 0), x), dim=1)
        x = self.dropout(x)
        return x


class Classifier(nn.Module):
    def __init__(self, embed_dim, n_classes):
        super().__init__()
        # New architectures skip fc1 and activations and directly apply fc2.
        self.fc1        = nn.Linear(embed_dim, embed_dim)
        self.activation = nn.Tanh()
        self.fc2        = nn.Linear(embed_dim, n_classes)

    def forward(self, x):
        x = x[:, 0, :]              # B, S, E --> B, E          Get CLS token
        x = self.fc1(x)             # B, E    --> B, E
        x = self.activation(x)      # B, E    --> B, E
        x = self.fc2(x)             # B, E    --> B, CL
        return x


class VisionTransformer_pytorch(nn.Module):
    def __init__(self, n_channels, embed_dim, n_layers, n_attention_heads, forward_mul, image_size, patch_size, n_classes, dropout=0.1):
        super().__init__()
        self.embedding  = EmbedLayer(n_channels, embed_dim, image_size, patch_size, dropout=dropout)
        encoder_layer   = nn.TransformerEncoderLayer(d_model=embed_dim,
                                                     nhead=n_attention_heads,
                                                     dim_feedforward=forward_mul*embed_dim,
                                                     dropout=dropout,
                                                     activation=nn.GELU(),
                                                     batch_first=True,
                                                     norm_first=True)
        self.encoder    = nn.TransformerEncoder(encoder_layer, n_layers, norm=nn.LayerNorm(embed_dim))
        self.classifier = Classifier(embed_dim, n_classes)

        self.apply(vit_init_weights)                                                    # Weight initalization

    def forward(self, x):
        x = self.embedding(x)
        x = self.encoder(x)
        x = self.classifier(x)
        return x


def vit_init_weights(m):
    if isinstance(m, nn.Conv2d) or isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, mean=0.0, std=0.02)
        if m.bias is not None:
            nn.init.constant_(m.bias, 0)

    elif isinstance(m, nn.LayerNorm):
        nn.init.constant_(m.weight, 1)
        nn.init.constant_(m.bias, 0)

    elif isinstance(m, EmbedLayer):
        nn.init.trunc_normal_(m.cls_token, mean=0.0, std=0.02)
        nn.init.trunc_normal_(m.pos_embedding, mean=0.0, std=0.02)


def make_model():
    return VisionTransformer_pytorch(n_channels=3, embed_dim=64, n_layers=3, n_attention_heads=4, forward_mul=2,
                                     image_size=32, patch_size=4, n_classes=10, dropout=0.1)
