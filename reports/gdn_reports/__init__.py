"""Report generators: reading results (inputs), accuracy and speed reports."""
