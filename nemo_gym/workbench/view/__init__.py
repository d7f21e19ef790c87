"""`ng view`: a local web app over rollout files (index, queries, HTTP app, the page in `static/`)."""
