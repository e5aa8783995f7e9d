from coldkv.cli import app

app()
