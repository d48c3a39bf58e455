"""Stand-ins for NVIDIA apex on Ascend."""
