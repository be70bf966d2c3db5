"""pdkit: deploy SGLang with prefill/decode disaggregation on bare-metal GPU hosts."""

__version__ = "0.1.0"
