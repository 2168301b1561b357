# vllm_fleet: controller-side logic (profiles, rendering, planning, metrics).
