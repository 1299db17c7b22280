"""Generated from proto/ by proto/generate.py. Do not edit."""
