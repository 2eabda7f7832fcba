"""What one replica must learn from the others within a second (DESIGN section 7, issue #10)."""
