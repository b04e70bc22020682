"""The small model of the engine and seam tests: two linear layers, a scalar loss."""

import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).float().pow(2).mean()
