"""Small models shared by studies (no study imports another's model)."""
