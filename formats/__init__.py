"""On-disk formats: one module per format, each with its reader, writer and strict validator.

Every other part of iekit (the converter, the runtime, the tests) goes through
these modules, so a format rule is written exactly once.
"""
