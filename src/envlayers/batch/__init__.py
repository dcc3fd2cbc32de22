"""``env_layers batch``: a data set in the OpenAI Batch format run through a live endpoint (docs/operating.md).

``records`` reads and checks the input and writes each answer once (a rerun resumes); ``run`` sends the
requests at a bounded concurrency with retries and follows the endpoint to a job's surviving replicas or
its successor.
"""
