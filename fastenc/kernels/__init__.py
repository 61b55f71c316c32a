"""Triton kernels, installed as fastenc.kernels. Nothing here touches a GPU at import."""
