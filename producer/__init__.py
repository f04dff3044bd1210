"""Producer: reads prompt sets, templates them with the model's chat template and enqueues token ids."""
