"""nn.Modules over fastenc.ops."""
